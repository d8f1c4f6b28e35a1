//! `[worker]`: what one replica holds in memory, how long a job may wait
//! in it, and how long a shutdown may take.

use std::time::Duration;

use serde::Deserialize;

use super::duration::human_duration;
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
