//! Kafka: the only module that imports `rdkafka`.
//!
//! - [`offsets`]: per-partition tracker of finished records; says which
//!   offset may be committed (pure, no rdkafka).

pub mod offsets;

pub use offsets::{Commit, Finish, Offsets, PartitionOffsets, TrackError};
