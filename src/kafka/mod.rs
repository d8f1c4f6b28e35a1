//! Kafka: the only module that imports `rdkafka`.
//!
//! - [`consumer`]: the group consumer with manual commits; tracks each
//!   record's offset and commits revoked partitions inside the rebalance;
//!   its periodic commits' answers are read by the poll thread without
//!   waiting for them (`consumer/commits.rs`).
//! - [`session`]: one consumer's bookkeeping through rebalances, records
//!   and commits, over a broker port (pure; librdkafka in [`consumer`], a
//!   deterministic broker in the simulation).
//! - [`record`]: what a consumer hands the worker (plain data).
//! - [`group`]: [`Consumers`], the worker's two consumers (the jobs topic,
//!   the retry tiers), each balanced over the replicas on its own.
//! - [`fence`]: when a consumer may have lost its session (a stall, a
//!   lost assignment) and calls nothing, and what confirms it again (pure).
//! - [`done_ranges`]: the finished records above a committed offset, as
//!   the commit's metadata carries them to the next owner (pure).
//! - [`ledger`]: the handoff ledger, what each commit says is finished,
//!   kept where a rebalance cannot refuse it (a port; Redis in the worker).
//! - [`offsets`]: per-partition tracker of finished records; says which
//!   offset may be committed (pure, no rdkafka).
//! - [`producer`]: [`RecordSink`] writes retry-topic and dead-letter records
//!   and waits for the broker's acknowledgement; [`RetryHeaders`] reads the
//!   worker's headers back.
//! - [`mock`]: `DevBroker`, librdkafka's embedded mock cluster for tests,
//!   the demo and `throttle-worker dev-broker`. A tool, not the product:
//!   built with the `dev-tools` feature only. It stays here, not in
//!   `dev/`, because it is rdkafka code and this module is rdkafka's one
//!   owner.
//! - [`reader`]: [`TopicReader`] reads a topic from its beginning to its
//!   end outside any group: `throttle-worker dlq` (product) and the demo's
//!   dead-letter count.

pub mod consumer;
pub mod done_ranges;
pub mod fence;
pub mod group;
pub mod ledger;
#[cfg(feature = "dev-tools")]
pub mod mock;
pub mod offsets;
pub mod producer;
pub mod reader;
pub mod record;
pub mod session;

pub use group::Consumers;
#[cfg(feature = "dev-tools")]
pub use mock::{parse_topic_spec, serve_dev_broker, DevBroker, MockError, TopicSpecError};
pub use offsets::{Commit, Finish, Offsets, PartitionOffsets, TrackError};
pub use producer::{
    HeaderError, OriginalRecord, Position, RecordSink, RetryHeaders, SinkError, Verdict,
};
pub use reader::{ReadRecord, ReaderError, TopicReader};
