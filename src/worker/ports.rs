//! The engine's ports: the only ways it reaches its world. Production
//! implements them with rdkafka, redis-rs and reqwest (through the modules
//! that own those crates); the deterministic simulation (`tests/sim/engine.rs`)
//! implements them in memory on a paused clock with a seeded random world.
//!
//! - [`Clock`]: every instant and every wall-clock reading the engine makes.
//! - [`Source`]: the consumer and its offsets: ownership, finish, pause and
//!   resume, commits.
//! - [`Writer`]: the retry tiers and the dead-letter topic.
//! - [`Caller`]: the downstream API.
//! - [`Permits`] (in [`super::permit`]): the limiter.
//!
//! [`Ports`] names one implementation of each, so the engine has one type
//! parameter. Errors that cross a port are typed: the engine decides on
//! their kind (a write that can never succeed is not retried), never on a
//! message's text.

use std::future::Future;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::downstream::{Answer, Downstream};
use crate::job::Job;
use crate::kafka::consumer::{HeldBack, Origin, TopicPartition};
use crate::kafka::producer::SinkError;
use crate::kafka::{Consumers, OriginalRecord, RecordSink, Verdict};

pub use super::permit::{PermitError, Permits};

/// The engine's clocks. Both are read through here so that a simulation
/// can run them on a paused tokio clock and make the wall clock jump.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time: every wait and deadline of the engine.
    fn now(&self) -> Instant;
    /// Wall-clock time in µs since the epoch: only for what crosses the
    /// process (the retry headers `x-not-before`, `x-release-at`). It may
    /// jump, backwards too; the engine never subtracts two readings of it
    /// without saturating.
    fn unix_us(&self) -> u64;

    fn unix_ms(&self) -> u64 {
        self.unix_us() / 1000
    }
}

/// The host's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// Why the final commit did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("the broker refused the commit: {0}")]
    Refused(String),
    #[error("the consumer is not running")]
    Stopped,
}

/// The consumer as the engine sees it: which records it still owns, which
/// are finished, which partitions to fetch, and commits. Records and
/// partition events arrive through the channels of [`super::engine::Deps`].
pub trait Source: Send + Sync + 'static {
    /// Whether `origin` belongs to the current assignment of its partition:
    /// work on a record that is not current is dropped, never finished.
    fn owns(&self, origin: &Origin) -> bool;
    /// Whether work on `origin` may start: it is owned and its partition
    /// is not being revoked. A revoking partition's work under way
    /// finishes (its records are still owned); none starts.
    fn may_start(&self, origin: &Origin) -> bool;
    /// Whether this replica may have lost its place in the group (a stall
    /// past the session timeout, a lost assignment) and has not confirmed
    /// it again: no downstream call starts meanwhile (issue 53). Its
    /// records stay owned and wait; nothing is dropped for it.
    fn fenced(&self) -> bool;
    /// The record is done, dead-lettered or safely on a retry tier: its
    /// offset may be committed once every record before it is too.
    fn finish(&self, origin: &Origin);
    fn pause(&self, parts: &[TopicPartition]);
    fn resume(&self, parts: &[TopicPartition]);
    fn assignment(&self) -> Vec<TopicPartition>;
    /// Partitions whose first unfinished record holds finished ones back.
    fn held_back(&self) -> Vec<HeldBack>;
    /// Commit every finished prefix, in the background.
    fn request_commit(&self);
    /// Commit every finished prefix and wait for the broker (shutdown).
    /// Returns how many partitions were committed.
    fn commit_all(&self) -> impl Future<Output = Result<usize, CommitError>> + Send;
}

/// Why a record could not be written to a retry tier or the dead-letter
/// topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// Over the producer's or the broker's message size: it will never be
    /// written as it is, however often it is tried.
    #[error("record too large for topic {topic:?}: {reason}")]
    TooLarge { topic: String, reason: String },
    /// Anything else (broker unreachable, timeout): worth trying again.
    #[error("write to topic {topic:?} failed: {reason}")]
    Failed { topic: String, reason: String },
}

/// The retry tiers and the dead-letter topic.
pub trait Writer: Send + Sync + 'static {
    /// A copy of `original` with what `verdict` says of it and the
    /// `x-original-*` position. Without `value`, the copy carries no payload
    /// (for a record too large to copy: the original still sits at its
    /// position).
    fn dead_letter(
        &self,
        topic: &str,
        original: &OriginalRecord,
        verdict: &Verdict<'_>,
        with_value: bool,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;

    /// A copy of `original` on a retry tier, run from `not_before_unix_ms`
    /// and taken up from the tier at `release_at_unix_ms`.
    fn to_retry_topic(
        &self,
        topic: &str,
        original: &OriginalRecord,
        not_before_unix_ms: u64,
        release_at_unix_ms: u64,
        attempts: u32,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// The downstream API: one job, one classified answer.
pub trait Caller: Send + Sync + 'static {
    /// Calls the downstream for `job`, naming its grant (Unix µs on the
    /// limiter's clock) when there is one.
    fn call(&self, job: &Job, granted_at_us: Option<u64>) -> impl Future<Output = Answer> + Send;
}

/// One implementation of each port: the engine's only type parameter.
pub trait Ports: Send + Sync + 'static {
    type Permits: Permits;
    type Source: Source;
    type Writer: Writer;
    type Caller: Caller;
    type Clock: Clock;
}

/// Production: librdkafka, Redis through the coalescer, reqwest.
pub struct Live;

impl Ports for Live {
    type Permits = crate::limiter::Coalescer<crate::limiter::RedisStore>;
    type Source = Consumers;
    type Writer = RecordSink;
    type Caller = Downstream;
    type Clock = SystemClock;
}

impl Source for Consumers {
    fn owns(&self, origin: &Origin) -> bool {
        Consumers::owns(self, origin)
    }

    fn may_start(&self, origin: &Origin) -> bool {
        Consumers::may_start(self, origin)
    }

    fn fenced(&self) -> bool {
        Consumers::fenced(self)
    }

    fn finish(&self, origin: &Origin) {
        Consumers::finish(self, origin);
    }

    fn pause(&self, parts: &[TopicPartition]) {
        Consumers::pause(self, parts);
    }

    fn resume(&self, parts: &[TopicPartition]) {
        Consumers::resume(self, parts);
    }

    fn assignment(&self) -> Vec<TopicPartition> {
        Consumers::assignment(self)
    }

    fn held_back(&self) -> Vec<HeldBack> {
        Consumers::held_back(self)
    }

    fn request_commit(&self) {
        Consumers::request_commit(self);
    }

    async fn commit_all(&self) -> Result<usize, CommitError> {
        use crate::kafka::consumer::ConsumerError;
        Consumers::commit_all(self).await.map_err(|e| match e {
            ConsumerError::Stopped => CommitError::Stopped,
            other => CommitError::Refused(other.to_string()),
        })
    }
}

fn write_error(e: SinkError) -> WriteError {
    match e {
        SinkError::TooLarge { topic, reason } => WriteError::TooLarge { topic, reason },
        SinkError::Delivery { topic, reason } => WriteError::Failed { topic, reason },
        SinkError::Create { brokers, reason } => WriteError::Failed {
            topic: String::new(),
            reason: format!("producer for {brokers}: {reason}"),
        },
    }
}

impl Writer for RecordSink {
    async fn dead_letter(
        &self,
        topic: &str,
        original: &OriginalRecord,
        verdict: &Verdict<'_>,
        with_value: bool,
    ) -> Result<(), WriteError> {
        if with_value {
            RecordSink::dead_letter(self, topic, original, verdict).await
        } else {
            let bare = OriginalRecord {
                origin: original.origin.clone(),
                key: original.key.clone(),
                value: bytes::Bytes::new(),
                trace: original.trace.clone(),
            };
            RecordSink::dead_letter(self, topic, &bare, verdict).await
        }
        .map_err(write_error)
    }

    async fn to_retry_topic(
        &self,
        topic: &str,
        original: &OriginalRecord,
        not_before_unix_ms: u64,
        release_at_unix_ms: u64,
        attempts: u32,
    ) -> Result<(), WriteError> {
        RecordSink::to_retry_topic(
            self,
            topic,
            original,
            not_before_unix_ms,
            release_at_unix_ms,
            attempts,
        )
        .await
        .map_err(write_error)
    }
}

impl Caller for Downstream {
    async fn call(&self, job: &Job, granted_at_us: Option<u64>) -> Answer {
        self.send_granted(job, granted_at_us).await
    }
}
