//! What the components' unit tests build their worlds from: jobs in
//! memory and default settings, without a broker, Redis or tokio.

use bytes::Bytes;
use tokio::time::Instant;

use crate::config::Settings;
use crate::job::Job;
use crate::kafka::consumer::Origin;
use crate::kafka::{OriginalRecord, Position};

use super::pending::Pending;

/// The defaults of `config/default.toml`.
pub(super) fn settings() -> Settings {
    crate::config::load_from(None, Vec::new())
        .expect("the defaults load")
        .settings
}

/// Where a job of `jobs`/`partition` at `offset` came from.
pub(super) fn origin(partition: i32, offset: i64) -> Origin {
    Origin {
        topic: "jobs".into(),
        partition,
        offset,
        generation: 1,
    }
}

/// A job of `seller` costing `cost`, read from `partition` at `offset`.
pub(super) fn pending(seller: &str, partition: i32, offset: i64, cost: u64) -> Pending {
    let value = format!(
        r#"{{"job_id":"j{partition}-{offset}","seller_id":"{seller}","cost":{cost},"payload":{{}}}}"#
    );
    let value = Bytes::from(value);
    let job = Job::parse_shared(&value, &settings().worker).expect("a valid job");
    let original = OriginalRecord {
        origin: Position {
            topic: "jobs".to_owned(),
            partition,
            offset,
        },
        key: None,
        value,
        trace: Default::default(),
    };
    let bytes = original.value.len();
    Pending::new(
        job,
        origin(partition, offset),
        original,
        0,
        bytes,
        Instant::now(),
    )
}

/// The lane of the jobs of `partition` keyed `key` (`worker.ordering =
/// "key"`, the key read from the record key).
pub(super) fn lane(partition: i32, key: &str) -> super::ordering::Lane {
    use super::ordering::{Ordering, Read};
    use crate::config::{OrderingKey, OrderingMode};
    let ordering = Ordering::new(OrderingMode::Key, OrderingKey::RecordKey);
    let o = Position {
        topic: "jobs".to_owned(),
        partition,
        offset: 0,
    };
    let read = Read {
        origin: &o,
        record_key: Some(key.as_bytes()),
        header: None,
        value: b"{}",
    };
    ordering.lane(read).0
}
