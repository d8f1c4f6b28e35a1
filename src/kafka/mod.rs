//! Kafka: the only module that imports `rdkafka`.
//!
//! - [`offsets`]: per-partition tracker of finished records; says which
//!   offset may be committed (pure, no rdkafka).
//! - [`mock`]: [`DevBroker`], librdkafka's embedded mock cluster for tests,
//!   the demo and `throttle-worker dev-broker`.

pub mod mock;
pub mod offsets;

pub use mock::{parse_topic_spec, serve_dev_broker, DevBroker, MockError, TopicSpecError};
pub use offsets::{Commit, Finish, Offsets, PartitionOffsets, TrackError};
