//! The job envelope: what one Kafka record value carries, and how it is
//! checked before anything else touches it.
//!
//! A record value is JSON `{"job_id": "...", "seller_id": "...", "payload": <any JSON>}`,
//! with an optional `"cost"`: a positive integer (default 1, at most
//! `worker.max_job_cost`) that the limiter charges and the downstream
//! receives as `X-Job-Cost`.
//! The payload is kept as raw JSON text and forwarded byte for byte as the
//! downstream body, so parsing never re-serialises it. Unknown top-level
//! fields are ignored so producers can add metadata without breaking workers.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::config::WorkerSettings;
use crate::dead_letter::DeadLetterKind;
use crate::telemetry::events::TraceContextInvalid;
use crate::telemetry::trace::JobTrace;
use crate::telemetry::traceparent::TraceHeaders;

/// The default of `worker.max_job_cost`: far above any real batch, low
/// enough that one job cannot drain a seller's quota for a day.
pub const DEFAULT_MAX_JOB_COST: u64 = 10_000;

/// What a record value is checked against (the `[worker]` limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest accepted `payload`, in bytes.
    pub max_payload_bytes: usize,
    /// Highest accepted `cost`; at least 1 (config validates it).
    pub max_job_cost: u64,
}

impl From<&WorkerSettings> for Limits {
    fn from(w: &WorkerSettings) -> Limits {
        Limits {
            max_payload_bytes: w.max_payload_bytes,
            max_job_cost: w.max_job_cost,
        }
    }
}

/// A bare payload limit, with the default cost cap. Kept so that
/// `Job::parse(value, max_payload_bytes)` callers still build; the engine
/// should pass `Limits::from(&settings.worker)` so the configured cap holds.
impl From<usize> for Limits {
    fn from(max_payload_bytes: usize) -> Limits {
        Limits {
            max_payload_bytes,
            max_job_cost: DEFAULT_MAX_JOB_COST,
        }
    }
}

/// The seller a job is throttled under. Never empty and free of control
/// characters (it travels as the `X-Seller-Id` header and inside Redis keys).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SellerId(String);

impl SellerId {
    /// Builds a seller id, or says why the text cannot be one.
    pub fn new(id: impl Into<String>) -> Result<SellerId, JobError> {
        let id = id.into();
        check_id(Field::SellerId, &id)?;
        Ok(SellerId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SellerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One parsed job.
#[derive(Debug)]
pub struct Job {
    /// Non-empty, no control characters: sent as `Idempotency-Key`.
    pub job_id: String,
    pub seller_id: SellerId,
    /// The `payload` member exactly as it appeared in the record (any JSON,
    /// `null` included), at most the configured `max_payload_bytes` long:
    /// a view into the record's value, not a copy of it (see
    /// [`Job::parse_shared`]), so a job in memory holds its payload once.
    pub payload: Bytes,
    /// Units the job weighs: at least 1, at most `worker.max_job_cost`.
    pub cost: u64,
    /// Which of its seller's ready jobs goes first: 0 (the default, bulk)
    /// to [`MAX_PRIORITY`]; a job gains a level per `worker.priority_aging`
    /// it waits, so bulk work never starves (`worker::seller`).
    pub priority: u8,
    /// Its W3C trace context and span ([`Job::traced`]); a job parsed
    /// without it starts a new trace at each downstream call.
    pub trace: JobTrace,
}

/// Which id field an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    JobId,
    SellerId,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::JobId => "job_id",
            Field::SellerId => "seller_id",
        })
    }
}

/// Why a record value is not a job. The `Display` text is written to the
/// dead-letter record's `x-error` header, so it says what is wrong without
/// echoing the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("record value is empty or null (tombstone); expected a JSON job object")]
    Empty,
    #[error("record value is not valid UTF-8 (invalid byte at offset {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    /// `reason` is serde_json's message: a position and an expectation,
    /// never the document's text.
    #[error("record value is not valid JSON: {reason}")]
    NotJson { reason: String },
    #[error("record value is JSON {found}, expected an object with job_id, seller_id and payload")]
    NotAnObject { found: &'static str },
    #[error("job has an invalid field: {reason}")]
    BadField { reason: String },
    #[error("job has no {0} (or it is null)")]
    MissingId(Field),
    #[error("job has an empty {0}")]
    EmptyId(Field),
    #[error("job {0} contains a control character, which cannot be sent as an HTTP header")]
    ControlCharacter(Field),
    #[error("job has no payload member")]
    MissingPayload,
    #[error("job payload is {size} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge { size: usize, limit: usize },
    /// `problem` never quotes the value beyond a parsed integer.
    #[error("job has an invalid cost: {problem}")]
    BadCost { problem: String },
    /// `problem` never quotes the value beyond a parsed integer.
    #[error("job has an invalid priority: {problem}")]
    BadPriority { problem: String },
}

impl JobError {
    /// A short, fixed label for metrics (bounded cardinality).
    pub fn kind(&self) -> &'static str {
        self.dead_letter_kind().name()
    }

    /// The kind of the dead letter this record becomes.
    pub fn dead_letter_kind(&self) -> DeadLetterKind {
        match self {
            JobError::Empty => DeadLetterKind::Empty,
            JobError::NotUtf8 { .. } => DeadLetterKind::NotUtf8,
            JobError::NotJson { .. } => DeadLetterKind::NotJson,
            JobError::NotAnObject { .. } => DeadLetterKind::NotObject,
            JobError::BadField { .. } => DeadLetterKind::BadField,
            JobError::MissingId(_) => DeadLetterKind::MissingId,
            JobError::EmptyId(_) => DeadLetterKind::EmptyId,
            JobError::ControlCharacter(_) => DeadLetterKind::ControlCharacter,
            JobError::MissingPayload => DeadLetterKind::MissingPayload,
            JobError::PayloadTooLarge { .. } => DeadLetterKind::PayloadTooLarge,
            JobError::BadCost { .. } => DeadLetterKind::BadCost,
            JobError::BadPriority { .. } => DeadLetterKind::BadPriority,
        }
    }
}

/// The wire shape. Every member is optional here so that a missing one gets
/// its own error instead of serde's generic "missing field".
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default)]
    job_id: Option<String>,
    #[serde(default)]
    seller_id: Option<String>,
    /// `None` only when the member is absent; a JSON `null` is kept as raw
    /// `null` (a plain `Option` would fold it into `None`). Borrowed from
    /// the record's text, so that the job can point into it.
    #[serde(default, borrow, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
    /// Kept raw so that `1e9` and `2.0` can be told apart from integers
    /// (serde would accept or round them); `null` is kept too and refused.
    #[serde(default, borrow, deserialize_with = "present")]
    cost: Option<&'a RawValue>,
    /// Kept raw, as `cost` is.
    #[serde(default, borrow, deserialize_with = "present")]
    priority: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl Job {
    /// Parses one record value. Pass `&[]` for a record without a value.
    ///
    /// ```
    /// use throttle_worker::job::{Job, JobError, Limits};
    ///
    /// let limits = Limits { max_payload_bytes: 1024, max_job_cost: 100 };
    /// let job = Job::parse(br#"{"job_id":"j1","seller_id":"s1","payload":{"a": 1}}"#, limits).unwrap();
    /// assert_eq!(job.payload_bytes(), br#"{"a": 1}"#);
    /// assert_eq!(job.cost, 1);
    /// let job = Job::parse(br#"{"job_id":"j1","seller_id":"s1","payload":1,"cost":7}"#, limits).unwrap();
    /// assert_eq!(job.cost, 7);
    /// assert_eq!(Job::parse(b"", limits).unwrap_err(), JobError::Empty);
    /// ```
    pub fn parse(value: &[u8], limits: impl Into<Limits>) -> Result<Job, JobError> {
        Job::parse_shared(&Bytes::copy_from_slice(value), limits)
    }

    /// [`Job::parse`] of a value the caller keeps: the job's payload is a
    /// view into `value`, not a copy.
    pub fn parse_shared(value: &Bytes, limits: impl Into<Limits>) -> Result<Job, JobError> {
        let Limits {
            max_payload_bytes,
            max_job_cost,
        } = limits.into();
        let text = std::str::from_utf8(value).map_err(|e| JobError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        let trimmed = text.trim_start();
        match trimmed.as_bytes().first() {
            None => return Err(JobError::Empty),
            Some(b'{') => {}
            // Checked before serde so its "invalid type: string \"...\""
            // message cannot quote a whole non-object value into x-error.
            Some(&b) => return Err(not_an_object(b, trimmed)),
        }
        let envelope: Envelope = serde_json::from_str(text).map_err(classify)?;
        let job_id = required_id(Field::JobId, envelope.job_id)?;
        let seller_id = SellerId(required_id(Field::SellerId, envelope.seller_id)?);
        let raw = envelope.payload.ok_or(JobError::MissingPayload)?.get();
        let size = raw.len();
        if size > max_payload_bytes {
            return Err(JobError::PayloadTooLarge {
                size,
                limit: max_payload_bytes,
            });
        }
        let cost = match envelope.cost {
            None => 1,
            Some(raw) => parse_cost(raw.get(), max_job_cost)?,
        };
        let priority = match envelope.priority {
            None => 0,
            Some(raw) => parse_priority(raw.get())?,
        };
        // `raw` borrows from `text`, which is `value`: its place in it.
        let start = raw.as_ptr() as usize - text.as_ptr() as usize;
        Ok(Job {
            job_id,
            seller_id,
            payload: value.slice(start..start + size),
            cost,
            priority,
            trace: JobTrace::default(),
        })
    }

    /// The job in the trace its record's headers name (a new trace if
    /// they name none, or an invalid one: counted, never an error).
    pub fn traced(mut self, headers: &TraceHeaders) -> Job {
        let (trace, invalid) =
            JobTrace::start(headers, &self.job_id, self.seller_id.as_str(), self.cost);
        if let Some(kind) = invalid {
            TraceContextInvalid { kind }.emit();
        }
        self.trace = trace;
        self
    }

    /// The downstream body: the payload's bytes as they were in the record.
    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }
}

/// The highest `priority` a job may name.
pub const MAX_PRIORITY: u8 = 9;

/// Checks the raw JSON text of `priority`: a plain integer from 0 to
/// [`MAX_PRIORITY`]. Strings are named, never quoted.
fn parse_priority(raw: &str) -> Result<u8, JobError> {
    let bad = |problem: String| Err(JobError::BadPriority { problem });
    let kind = json_kind(raw);
    if let Some(kind) = kind {
        return bad(format!(
            "must be an integer from 0 to {MAX_PRIORITY}, got {kind}"
        ));
    }
    match raw.parse::<u8>() {
        Ok(p) if p <= MAX_PRIORITY => Ok(p),
        _ if raw.contains(['e', 'E', '.']) => bad(format!(
            "must be a plain integer from 0 to {MAX_PRIORITY}, got a fraction or exponent form"
        )),
        _ => bad(format!("must be an integer from 0 to {MAX_PRIORITY}")),
    }
}

/// What a raw JSON value that is not a number is, to name it in an error.
fn json_kind(raw: &str) -> Option<&'static str> {
    match raw.as_bytes().first() {
        Some(b'"') => Some("a string"),
        Some(b't' | b'f') => Some("a boolean"),
        Some(b'n') => Some("null"),
        Some(b'[') => Some("an array"),
        Some(b'{') => Some("an object"),
        _ => None,
    }
}

/// Checks the raw JSON text of `cost`: a plain positive integer within the
/// cap. Strings are named, never quoted (they could be anything).
fn parse_cost(raw: &str, max: u64) -> Result<u64, JobError> {
    let bad = |problem: String| Err(JobError::BadCost { problem });
    if let Some(kind) = json_kind(raw) {
        return bad(format!("must be a positive integer, got {kind}"));
    }
    if raw.starts_with('-') {
        return bad("must be a positive integer, got a negative number".into());
    }
    if raw.contains(['e', 'E']) {
        return bad("must be a plain integer such as 3, got exponent form".into());
    }
    if raw.contains('.') {
        return bad("must be a whole number, got a fraction".into());
    }
    // serde_json has checked the syntax: what is left is ASCII digits, so
    // the only parse error is a number beyond u64, which is over any cap.
    let Ok(cost) = raw.parse::<u64>() else {
        return bad(format!("is over worker.max_job_cost ({max})"));
    };
    if cost == 0 {
        return bad("must be at least 1, got 0".into());
    }
    if cost > max {
        return bad(format!("{cost} is over worker.max_job_cost ({max})"));
    }
    Ok(cost)
}

fn required_id(field: Field, value: Option<String>) -> Result<String, JobError> {
    let value = value.ok_or(JobError::MissingId(field))?;
    check_id(field, &value)?;
    Ok(value)
}

fn check_id(field: Field, value: &str) -> Result<(), JobError> {
    if value.is_empty() {
        return Err(JobError::EmptyId(field));
    }
    if value.chars().any(char::is_control) {
        return Err(JobError::ControlCharacter(field));
    }
    Ok(())
}

/// Names the JSON kind from its first byte, or reports broken JSON.
fn not_an_object(first: u8, text: &str) -> JobError {
    let found = match first {
        b'[' => "array",
        b'"' => "string",
        b't' | b'f' => "boolean",
        b'n' if text.trim_end() == "null" => return JobError::Empty,
        b'n' => "null",
        b'-' | b'0'..=b'9' => "number",
        _ => {
            // Not a JSON value at all: let serde name the position.
            return match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Err(e) => classify(e),
                Ok(_) => JobError::NotAnObject { found: "value" },
            };
        }
    };
    JobError::NotAnObject { found }
}

/// Syntax and end-of-input errors mean "not JSON"; data errors mean a member
/// has the wrong type (e.g. a numeric job_id).
fn classify(e: serde_json::Error) -> JobError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => JobError::BadField {
            reason: e.to_string(),
        },
        Category::Syntax | Category::Eof | Category::Io => JobError::NotJson {
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 6, defect 7: a job in memory holds its payload once, as a view
    /// into the record's value, not a second copy of it.
    #[test]
    fn shared_parse_points_into_the_record_value() {
        let value =
            Bytes::from_static(br#"{"job_id":"j","seller_id":"s","payload":{"big":"xxxxxxxx"}}"#);
        let job = Job::parse_shared(&value, 1024).unwrap();
        assert_eq!(job.payload_bytes(), br#"{"big":"xxxxxxxx"}"#);
        let (start, end) = (
            value.as_ptr() as usize,
            value.as_ptr() as usize + value.len(),
        );
        let at = job.payload.as_ptr() as usize;
        assert!(
            (start..end).contains(&at),
            "the payload was copied instead of shared"
        );
    }

    const LIMIT: usize = 64;

    /// (row, record value, expected (job_id, seller_id, payload) or error)
    type Row<'a> = (u32, &'a [u8], Result<(&'a str, &'a str, &'a str), JobError>);

    #[test]
    fn parse_table() {
        use JobError::*;
        let big = format!(
            r#"{{"job_id":"j","seller_id":"s","payload":"{}"}}"#,
            "x".repeat(LIMIT)
        );
        let cases: Vec<Row> = vec![
            (
                1,
                br#"{"job_id":"j1","seller_id":"s1","payload":{"a":1}}"#,
                Ok(("j1", "s1", r#"{"a":1}"#)),
            ),
            // payload kept byte for byte: spacing, key order, number spelling.
            (
                2,
                br#"{"payload": { "z" : 1.50, "a":[ ] } ,"seller_id":"s","job_id":"j"}"#,
                Ok(("j", "s", r#"{ "z" : 1.50, "a":[ ] }"#)),
            ),
            (
                3,
                br#"{"job_id":"j","seller_id":"s","payload":null}"#,
                Ok(("j", "s", "null")),
            ),
            (
                4,
                br#"{"job_id":"j","seller_id":"s","payload":"text","extra":true}"#,
                Ok(("j", "s", r#""text""#)),
            ),
            (5, b"", Err(Empty)),
            (6, b"  \n ", Err(Empty)),
            (7, b"null", Err(Empty)),
            (8, b"\xff\xfe{}", Err(NotUtf8 { valid_up_to: 0 })),
            (
                9,
                b"{\"job_id\":",
                Err(NotJson {
                    reason: "EOF while parsing a value at line 1 column 10".into(),
                }),
            ),
            (
                10,
                b"hello",
                Err(NotJson {
                    reason: "expected value at line 1 column 1".into(),
                }),
            ),
            (11, b"[1,2]", Err(NotAnObject { found: "array" })),
            (
                12,
                br#""secret payload""#,
                Err(NotAnObject { found: "string" }),
            ),
            (13, b"42", Err(NotAnObject { found: "number" })),
            (
                14,
                br#"{"seller_id":"s","payload":1}"#,
                Err(MissingId(Field::JobId)),
            ),
            (
                15,
                br#"{"job_id":null,"seller_id":"s","payload":1}"#,
                Err(MissingId(Field::JobId)),
            ),
            (
                16,
                br#"{"job_id":"","seller_id":"s","payload":1}"#,
                Err(EmptyId(Field::JobId)),
            ),
            (
                17,
                br#"{"job_id":"j","payload":1}"#,
                Err(MissingId(Field::SellerId)),
            ),
            (
                18,
                br#"{"job_id":"j","seller_id":"","payload":1}"#,
                Err(EmptyId(Field::SellerId)),
            ),
            (
                19,
                br#"{"job_id":"j","seller_id":"s"}"#,
                Err(MissingPayload),
            ),
            (
                20,
                big.as_bytes(),
                Err(PayloadTooLarge {
                    size: LIMIT + 2,
                    limit: LIMIT,
                }),
            ),
            (
                21,
                br#"{"job_id":5,"seller_id":"s","payload":1}"#,
                Err(BadField {
                    reason: "invalid type: integer `5`, expected a string at line 1 column 11"
                        .into(),
                }),
            ),
            (
                22,
                b"{\"job_id\":\"a\\nb\",\"seller_id\":\"s\",\"payload\":1}",
                Err(ControlCharacter(Field::JobId)),
            ),
            (
                23,
                br#"{"job_id":"j","seller_id":"s","payload":1} trailing"#,
                Err(NotJson {
                    reason: "trailing characters at line 1 column 44".into(),
                }),
            ),
        ];
        for (row, value, want) in cases {
            let got = Job::parse(value, LIMIT);
            match (got, want) {
                (Ok(job), Ok((id, seller, payload))) => {
                    assert_eq!(job.job_id, id, "row {row}");
                    assert_eq!(job.seller_id.as_str(), seller, "row {row}");
                    assert_eq!(job.payload_bytes(), payload.as_bytes(), "row {row}");
                }
                (Err(got), Err(want)) => assert_eq!(got, want, "row {row}: {got}"),
                (got, want) => panic!("row {row}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn payload_exactly_at_limit_is_accepted() {
        let payload = format!("\"{}\"", "x".repeat(LIMIT - 2));
        let value = format!(r#"{{"job_id":"j","seller_id":"s","payload":{payload}}}"#);
        let job = Job::parse(value.as_bytes(), LIMIT).expect("payload of exactly LIMIT bytes");
        assert_eq!(job.payload_bytes(), payload.as_bytes());
    }

    #[test]
    fn error_messages_are_readable_and_never_quote_the_payload() {
        let e = Job::parse(br#""do not leak me""#, LIMIT).unwrap_err();
        assert!(!e.to_string().contains("leak"), "{e}");
        let e = Job::parse(
            br#"{"job_id":"j","seller_id":"s","payload":"0123456789"}"#,
            4,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "job payload is 12 bytes, over the limit of 4 bytes"
        );
        assert_eq!(e.kind(), "payload_too_large");
        let e = Job::parse(b"{", LIMIT).unwrap_err();
        assert_eq!(
            e.to_string(),
            "record value is not valid JSON: EOF while parsing an object at line 1 column 1"
        );
        assert_eq!(
            JobError::EmptyId(Field::SellerId).to_string(),
            "job has an empty seller_id"
        );
    }

    /// Issue 7: the optional `cost` member. Every refusal names the field
    /// and what is wrong (it becomes the dead letter's `x-error`).
    #[test]
    fn cost_table() {
        let limits = Limits {
            max_payload_bytes: LIMIT,
            max_job_cost: 100,
        };
        let bad = |problem: &str| -> Result<u64, String> {
            Err(format!("job has an invalid cost: {problem}"))
        };
        let cases: Vec<(u32, &str, Result<u64, String>)> = vec![
            (1, "", Ok(1)),
            (2, r#","cost":1"#, Ok(1)),
            (3, r#","cost":7"#, Ok(7)),
            (4, r#","cost":100"#, Ok(100)),
            (5, r#","cost": 42 "#, Ok(42)),
            (6, r#","cost":0"#, bad("must be at least 1, got 0")),
            (
                7,
                r#","cost":-3"#,
                bad("must be a positive integer, got a negative number"),
            ),
            (
                8,
                r#","cost":-0"#,
                bad("must be a positive integer, got a negative number"),
            ),
            (
                9,
                r#","cost":2.5"#,
                bad("must be a whole number, got a fraction"),
            ),
            (
                10,
                r#","cost":2.0"#,
                bad("must be a whole number, got a fraction"),
            ),
            (
                11,
                r#","cost":"ten""#,
                bad("must be a positive integer, got a string"),
            ),
            (
                12,
                r#","cost":"5""#,
                bad("must be a positive integer, got a string"),
            ),
            (
                13,
                r#","cost":1e9"#,
                bad("must be a plain integer such as 3, got exponent form"),
            ),
            (
                14,
                r#","cost":1E2"#,
                bad("must be a plain integer such as 3, got exponent form"),
            ),
            (
                15,
                r#","cost":101"#,
                bad("101 is over worker.max_job_cost (100)"),
            ),
            (
                16,
                r#","cost":1000000000"#,
                bad("1000000000 is over worker.max_job_cost (100)"),
            ),
            (
                17,
                r#","cost":18446744073709551616"#,
                bad("is over worker.max_job_cost (100)"),
            ),
            (
                18,
                r#","cost":null"#,
                bad("must be a positive integer, got null"),
            ),
            (
                19,
                r#","cost":true"#,
                bad("must be a positive integer, got a boolean"),
            ),
            (
                20,
                r#","cost":[1]"#,
                bad("must be a positive integer, got an array"),
            ),
            (
                21,
                r#","cost":{"n":1}"#,
                bad("must be a positive integer, got an object"),
            ),
            (
                22,
                r#","cost":-1.5e3"#,
                bad("must be a positive integer, got a negative number"),
            ),
        ];
        for (row, member, want) in cases {
            let value = format!(r#"{{"job_id":"j","seller_id":"s","payload":1{member}}}"#);
            let got = Job::parse(value.as_bytes(), limits)
                .map(|j| j.cost)
                .map_err(|e| {
                    assert_eq!(e.kind(), "bad_cost", "row {row}: {e}");
                    e.to_string()
                });
            assert_eq!(got, want, "row {row}: {value}");
        }
    }

    /// Issue 36 part 5: the optional `priority` member, 0 (bulk, the
    /// default) to 9; every refusal names what was wrong, never the value.
    #[test]
    fn priority_table() {
        let bad = |problem: &str| Err(format!("job has an invalid priority: {problem}"));
        let cases: Vec<(&str, Result<u8, String>)> = vec![
            ("", Ok(0)),
            (r#","priority":0"#, Ok(0)),
            (r#","priority":9"#, Ok(9)),
            (r#","priority":10"#, bad("must be an integer from 0 to 9")),
            (r#","priority":-1"#, bad("must be an integer from 0 to 9")),
            (
                r#","priority":2.5"#,
                bad("must be a plain integer from 0 to 9, got a fraction or exponent form"),
            ),
            (
                r#","priority":"interactive""#,
                bad("must be an integer from 0 to 9, got a string"),
            ),
            (
                r#","priority":null"#,
                bad("must be an integer from 0 to 9, got null"),
            ),
        ];
        for (member, want) in cases {
            let value = format!(r#"{{"job_id":"j","seller_id":"s","payload":1{member}}}"#);
            let got = Job::parse(value.as_bytes(), LIMIT)
                .map(|j| j.priority)
                .map_err(|e| {
                    assert_eq!(e.kind(), "bad_priority", "{member}: {e}");
                    e.to_string()
                });
            assert_eq!(got, want, "{member}");
        }
    }

    #[test]
    fn cost_cap_comes_from_limits_and_a_bare_payload_limit_uses_the_default() {
        let value = br#"{"job_id":"j","seller_id":"s","payload":1,"cost":10000}"#;
        assert_eq!(
            Job::parse(value, LIMIT).map(|j| j.cost),
            Ok(DEFAULT_MAX_JOB_COST)
        );
        let tight = Limits {
            max_payload_bytes: LIMIT,
            max_job_cost: 9_999,
        };
        assert_eq!(Job::parse(value, tight).unwrap_err().kind(), "bad_cost");
        let dup = br#"{"job_id":"j","seller_id":"s","payload":1,"cost":1,"cost":2}"#;
        assert_eq!(Job::parse(dup, LIMIT).unwrap_err().kind(), "bad_field");
    }

    #[test]
    fn seller_id_constructor_validates() {
        assert_eq!(
            SellerId::new("s-1").map(|s| s.to_string()),
            Ok("s-1".to_owned())
        );
        assert_eq!(SellerId::new(""), Err(JobError::EmptyId(Field::SellerId)));
        assert_eq!(
            SellerId::new("a\tb"),
            Err(JobError::ControlCharacter(Field::SellerId))
        );
    }
}
