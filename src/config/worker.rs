//! `[worker]`: what one replica holds in memory, how long a job may wait
//! in it, and how long a shutdown may take.

use std::time::Duration;

use serde::Deserialize;

use super::duration::{human_duration, human_duration_opt};
use super::error::{self, Invalid};
use super::size::human_size;

/// Upper bound of `worker.shutdown_timeout`.
const MAX_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3600);

/// `[worker]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Jobs held in memory per replica (waiting + in flight); fetching
    /// pauses beyond it.
    pub max_buffered: usize,
    /// Bytes of jobs held in memory per replica (record key and value plus
    /// a fixed overhead per job); fetching pauses beyond it too. An
    /// integer or a size with a unit, e.g. "256MiB".
    #[serde(deserialize_with = "human_size")]
    pub max_buffered_bytes: usize,
    /// A partition's first unfinished record that has waited this long in
    /// memory while later records finished is sent to the retry topic, so
    /// the partition can commit past it.
    #[serde(deserialize_with = "human_duration")]
    pub max_head_wait: Duration,
    /// The most finished records a partition keeps above its first
    /// unfinished one before that record is sent to the retry topic (bounds
    /// the offset tracker and the commit metadata).
    pub max_finished_ahead: usize,
    /// A job that would wait longer than this goes to the retry topic
    /// instead of being held in memory.
    #[serde(deserialize_with = "human_duration")]
    pub max_inline_delay: Duration,
    /// How long in-flight calls may take to finish on SIGTERM.
    #[serde(deserialize_with = "human_duration")]
    pub shutdown_timeout: Duration,
    /// The longest a revoke waits, inside the rebalance, for the calls
    /// under way on its partitions before it commits and hands them over
    /// (a success answered later is done again by the next owner). Unset:
    /// `downstream.timeout`, by when every call under way has answered or
    /// timed out, capped at half of `max.poll.interval.ms`. Must be below
    /// `max.poll.interval.ms`: the wait holds the consumer's next poll, and
    /// the group's rebalance, back.
    #[serde(default, deserialize_with = "human_duration_opt")]
    pub revoke_wait: Option<Duration>,
    /// Larger payloads are dead-lettered. An integer or a size with a
    /// unit, e.g. "1MiB".
    #[serde(deserialize_with = "human_size")]
    pub max_payload_bytes: usize,
    /// Highest `cost` a job may declare; above it the job is dead-lettered.
    /// At least 1. Default 10000.
    pub max_job_cost: u64,
    /// A waiting job gains one level of `priority` per this much time it
    /// waits in this replica (0, bulk, to 9), so a seller's bulk work is
    /// never starved by its urgent jobs: after 9 × this, a bulk job goes
    /// before any new one. Default 30s.
    #[serde(deserialize_with = "human_duration")]
    pub priority_aging: Duration,
    /// Which of a seller's jobs reach the downstream one at a time, in
    /// offset order: those of one ordering key (`key`, the default), all
    /// of one partition (`seller`), or none (`none`).
    pub ordering: OrderingMode,
    /// Where a job's ordering key is read (`worker.ordering = "key"`): a
    /// JSON pointer into the record value (default `/payload/sku`),
    /// `record_key`, or `header:<name>`. A job without one falls back to
    /// its record key, then to its partition.
    pub ordering_key: OrderingKey,
}

/// `worker.ordering`: the unit whose jobs go one at a time, in offset order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderingMode {
    /// The jobs of one ordering key (within a partition).
    Key,
    /// The jobs of one seller within a partition.
    Seller,
    /// No order: every job may run beside any other.
    None,
}

/// `worker.ordering_key`: where a job's ordering key is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderingKey {
    /// The Kafka record key.
    RecordKey,
    /// The value of the record header of this name.
    Header(String),
    /// The member of the record value at this JSON pointer (RFC 6901),
    /// held as its unescaped reference tokens.
    Field {
        pointer: String,
        tokens: Vec<String>,
    },
}

impl OrderingKey {
    /// Reads `record_key`, `header:<name>` or a JSON pointer.
    pub fn parse(s: &str) -> Result<OrderingKey, String> {
        let s = s.trim();
        if s == "record_key" {
            return Ok(OrderingKey::RecordKey);
        }
        if let Some(name) = s.strip_prefix("header:") {
            let name = name.trim();
            if name.is_empty() {
                return Err("\"header:\" needs a header name, e.g. \"header:product-id\"".into());
            }
            return Ok(OrderingKey::Header(name.to_owned()));
        }
        if let Some(rest) = s.strip_prefix('/') {
            let mut tokens = Vec::new();
            for raw in rest.split('/') {
                tokens.push(unescape_token(raw).ok_or_else(|| {
                    format!("JSON pointer {s:?}: \"~\" must be followed by 0 or 1 (RFC 6901)")
                })?);
            }
            return Ok(OrderingKey::Field {
                pointer: s.to_owned(),
                tokens,
            });
        }
        Err(format!(
            "{s:?} is not an ordering key source: write \"record_key\", \"header:<name>\" or a JSON pointer into the record value such as \"/payload/sku\""
        ))
    }
}

/// A JSON pointer's reference token with `~1` and `~0` undone.
fn unescape_token(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('~'),
            Some('1') => out.push('/'),
            _ => return None,
        }
    }
    Some(out)
}

impl<'de> Deserialize<'de> for OrderingKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OrderingKey, D::Error> {
        let s = String::deserialize(d)?;
        OrderingKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl WorkerSettings {
    /// Checks that serde's types cannot express.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        error::at_least_one(&[
            ("worker.max_buffered", self.max_buffered as u64),
            ("worker.max_buffered_bytes", self.max_buffered_bytes as u64),
            ("worker.max_finished_ahead", self.max_finished_ahead as u64),
            ("worker.max_payload_bytes", self.max_payload_bytes as u64),
            ("worker.max_job_cost", self.max_job_cost),
        ])?;
        error::longer_than_zero(&[
            ("worker.max_head_wait", self.max_head_wait),
            ("worker.priority_aging", self.priority_aging),
        ])?;
        // Added to an instant at shutdown; an hour is longer than any
        // orchestrator waits for a process to stop.
        if self.shutdown_timeout > MAX_SHUTDOWN_TIMEOUT {
            return Err(Invalid::new(
                "worker.shutdown_timeout",
                WorkerProblem::ShutdownTooLong,
            ));
        }
        Ok(())
    }
}

/// What is wrong with a value of `[worker]`.
#[derive(Debug, thiserror::Error)]
pub(super) enum WorkerProblem {
    #[error("must be at most 1h (an orchestrator kills the process long before)")]
    ShutdownTooLong,
}
