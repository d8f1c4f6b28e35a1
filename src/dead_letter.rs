//! The reason kinds of dead letters: the one list of them.
//!
//! A dead letter carries its kind in the `x-error-kind` header and the
//! `reason` label of `throttle_jobs_dead_lettered_total`. The code that
//! dead-letters a record names its kind from [`DeadLetterKind`], `dlq
//! --reason` accepts only [`DeadLetterKind::ALL`], and the docs page
//! "dead-letter kinds" is generated from [`DeadLetterKind::description`]:
//! a kind added here is known to all three at once. Leaf module.

use std::fmt;
use std::str::FromStr;

/// Why a record went to the dead-letter topic, as a short fixed label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadLetterKind {
    /// The record's value is empty or null (a tombstone).
    Empty,
    /// The record's value is not UTF-8.
    NotUtf8,
    /// The record's value is not JSON.
    NotJson,
    /// The record's value is JSON, but not an object.
    NotObject,
    /// A member of the job has the wrong type.
    BadField,
    /// The job has no `job_id` or no `seller_id`.
    MissingId,
    /// The job's `job_id` or `seller_id` is empty.
    EmptyId,
    /// The job's `job_id` or `seller_id` holds a control character.
    ControlCharacter,
    /// The job has no `payload` member.
    MissingPayload,
    /// The job's payload is over `worker.max_payload_bytes`.
    PayloadTooLarge,
    /// The job's `cost` is not a positive integer up to `worker.max_job_cost`.
    BadCost,
    /// The job's `priority` is not an integer from 0 to 9.
    BadPriority,
    /// The worker's own headers on a retry record cannot be read.
    UnreadableHeaders,
    /// The job's cost is above what one of its seller's rules can ever grant.
    CostOverCapacity,
    /// The downstream refused the job with a status not worth a retry.
    DownstreamRejected,
    /// The downstream failed `downstream.max_attempts` times for the job.
    AttemptsExhausted,
    /// A dead letter written by a version before the kind header.
    Unknown,
}

impl DeadLetterKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [DeadLetterKind; 17] = [
        DeadLetterKind::Empty,
        DeadLetterKind::NotUtf8,
        DeadLetterKind::NotJson,
        DeadLetterKind::NotObject,
        DeadLetterKind::BadField,
        DeadLetterKind::MissingId,
        DeadLetterKind::EmptyId,
        DeadLetterKind::ControlCharacter,
        DeadLetterKind::MissingPayload,
        DeadLetterKind::PayloadTooLarge,
        DeadLetterKind::BadCost,
        DeadLetterKind::BadPriority,
        DeadLetterKind::UnreadableHeaders,
        DeadLetterKind::CostOverCapacity,
        DeadLetterKind::DownstreamRejected,
        DeadLetterKind::AttemptsExhausted,
        DeadLetterKind::Unknown,
    ];

    /// The label in the header, the metric and `dlq --reason`.
    pub const fn name(self) -> &'static str {
        match self {
            DeadLetterKind::Empty => "empty",
            DeadLetterKind::NotUtf8 => "not_utf8",
            DeadLetterKind::NotJson => "not_json",
            DeadLetterKind::NotObject => "not_object",
            DeadLetterKind::BadField => "bad_field",
            DeadLetterKind::MissingId => "missing_id",
            DeadLetterKind::EmptyId => "empty_id",
            DeadLetterKind::ControlCharacter => "control_character",
            DeadLetterKind::MissingPayload => "missing_payload",
            DeadLetterKind::PayloadTooLarge => "payload_too_large",
            DeadLetterKind::BadCost => "bad_cost",
            DeadLetterKind::BadPriority => "bad_priority",
            DeadLetterKind::UnreadableHeaders => "unreadable_headers",
            DeadLetterKind::CostOverCapacity => "cost_over_capacity",
            DeadLetterKind::DownstreamRejected => "downstream_rejected",
            DeadLetterKind::AttemptsExhausted => "attempts_exhausted",
            DeadLetterKind::Unknown => "unknown",
        }
    }

    /// One sentence for the docs: when the kind is assigned, and what to do.
    pub fn description(self) -> &'static str {
        match self {
            DeadLetterKind::Empty => "The record's value was empty or null (a tombstone); fix the producer, a replay fails the same way.",
            DeadLetterKind::NotUtf8 => "The record's value is not UTF-8 text; fix the producer's encoding, a replay fails the same way.",
            DeadLetterKind::NotJson => "The record's value does not parse as JSON; fix the producer, a replay fails the same way.",
            DeadLetterKind::NotObject => "The value is JSON but not an object with job_id, seller_id and payload; fix the producer.",
            DeadLetterKind::BadField => "A job member has the wrong type (x-error names it); fix the producer.",
            DeadLetterKind::MissingId => "The job has no job_id or seller_id (or it is null); fix the producer.",
            DeadLetterKind::EmptyId => "The job's job_id or seller_id is an empty string; fix the producer.",
            DeadLetterKind::ControlCharacter => "The job's job_id or seller_id holds a control character, which cannot go in an HTTP header; fix the producer.",
            DeadLetterKind::MissingPayload => "The job has no payload member; fix the producer.",
            DeadLetterKind::PayloadTooLarge => "The payload is over worker.max_payload_bytes; raise the limit and replay, or fix the producer.",
            DeadLetterKind::BadCost => "The job's cost is not a positive integer up to worker.max_job_cost; raise the limit and replay, or fix the producer.",
            DeadLetterKind::BadPriority => "The job's priority is not an integer from 0 (bulk, the default) to 9; fix the producer, then replay.",
            DeadLetterKind::UnreadableHeaders => "A retry record's worker headers could not be read (another writer, or a bug); inspect it, then replay it.",
            DeadLetterKind::CostOverCapacity => "The job's cost is above what one of its seller's rules can ever grant; raise the rule's limit or burst, then replay.",
            DeadLetterKind::DownstreamRejected => "The downstream refused the job with a status not in downstream.retry_statuses; fix the job or the downstream, then replay.",
            DeadLetterKind::AttemptsExhausted => "The downstream failed downstream.max_attempts times for the job; once it is healthy, replay.",
            DeadLetterKind::Unknown => "Written by a version before the x-error-kind header; read x-error to decide.",
        }
    }
}

impl fmt::Display for DeadLetterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A label that names no kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dead-letter kind {given:?}; the kinds are: {}", DeadLetterKind::ALL.map(DeadLetterKind::name).join(", "))]
pub struct UnknownKind {
    pub given: String,
}

impl FromStr for DeadLetterKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeadLetterKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownKind {
                given: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for k in DeadLetterKind::ALL {
            assert!(seen.insert(k.name()), "{} twice", k.name());
            assert_eq!(k.name().parse::<DeadLetterKind>(), Ok(k));
            assert!(k.description().ends_with('.'), "{k}: one sentence");
        }
        let e = "nonsense".parse::<DeadLetterKind>().unwrap_err();
        assert!(e.to_string().contains("attempts_exhausted"), "{e}");
    }
}
