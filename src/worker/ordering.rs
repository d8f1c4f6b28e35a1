//! Which of a seller's jobs must reach the downstream one at a time, in
//! offset order (`worker.ordering`): the lane each job runs in.
//!
//! A lane is the unit of order. Two jobs of one lane are never out
//! together, and a lane's jobs go in the order they were read (offset
//! order within a partition); jobs of different lanes run side by side,
//! bounded only by the seller's rules, share and `max_in_flight`. Lanes are
//! scoped to a partition, as Kafka's own order is: a key is ordered where
//! the producer put all its records, in one partition. A record back from
//! a retry tier is in the lane of where it first entered (its
//! `x-original-*` position), so on one replica it never runs beside a
//! later job of its key; the later jobs did not wait for it while it was
//! on the tier, though (docs: "Ordering").
//!
//! A lane is a 64-bit hash of (topic, partition, what orders). Two keys
//! that collide share a lane: they are ordered together, which costs a
//! little concurrency and never order.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use serde_json::value::RawValue;

use crate::config::{OrderingKey, OrderingMode, WorkerSettings};
use crate::kafka::Position;

/// The unit of order a job belongs to, within its seller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lane(u64);

/// Lanes as a set: a lane is a hash already, so it is its own (a
/// scheduler reads up to 512 jobs' lanes per ask).
pub type LaneSet = HashSet<Lane, BuildHasherDefault<LaneHasher>>;
/// A map keyed by lane, hashed as [`LaneSet`].
pub type LaneMap<V> = HashMap<Lane, V, BuildHasherDefault<LaneHasher>>;

/// Hashes a [`Lane`] as itself.
#[derive(Debug, Default)]
pub struct LaneHasher(u64);

impl Hasher for LaneHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    /// Not reached by a lane (its one field is a `u64`); folds anything
    /// else so that the type stays a correct hasher.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

/// What a job's lane was drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFrom {
    /// `worker.ordering_key`, as configured.
    Configured,
    /// Its record key: the configured source named nothing in this job.
    RecordKey,
    /// Its partition: neither the configured source nor a record key.
    Partition,
    /// Not read: `worker.ordering` is `seller` or `none`.
    Mode,
}

impl KeyFrom {
    pub fn label(self) -> &'static str {
        match self {
            KeyFrom::Configured => "configured",
            KeyFrom::RecordKey => "record_key",
            KeyFrom::Partition => "partition",
            KeyFrom::Mode => "mode",
        }
    }
}

/// What [`Ordering::lane`] reads of a record.
#[derive(Debug, Clone, Copy)]
pub struct Read<'a> {
    /// Where the record first entered (its original position).
    pub origin: &'a Position,
    pub record_key: Option<&'a [u8]>,
    /// The value of the header `worker.ordering_key` names, if it names one.
    pub header: Option<&'a [u8]>,
    /// The record value (JSON).
    pub value: &'a [u8],
}

/// `worker.ordering` and `worker.ordering_key`: a job's lane.
#[derive(Debug, Clone)]
pub struct Ordering {
    mode: OrderingMode,
    key: OrderingKey,
}

impl Ordering {
    pub fn new(mode: OrderingMode, key: OrderingKey) -> Ordering {
        Ordering { mode, key }
    }

    pub fn from_settings(w: &WorkerSettings) -> Ordering {
        Ordering::new(w.ordering, w.ordering_key.clone())
    }

    /// The header a record must carry its key in, when the key is read
    /// from one.
    pub fn header(&self) -> Option<&str> {
        match (&self.mode, &self.key) {
            (OrderingMode::Key, OrderingKey::Header(name)) => Some(name),
            _ => None,
        }
    }

    /// The lane of the job read from `r`, and what it was drawn from.
    pub fn lane(&self, r: Read<'_>) -> (Lane, KeyFrom) {
        match self.mode {
            OrderingMode::Seller => (partition_lane(r.origin), KeyFrom::Mode),
            OrderingMode::None => (
                lane_of(r.origin, Tag::Offset, &r.origin.offset.to_le_bytes()),
                KeyFrom::Mode,
            ),
            OrderingMode::Key => {
                let configured = match &self.key {
                    OrderingKey::RecordKey => r.record_key.map(<[u8]>::to_vec),
                    OrderingKey::Header(_) => r.header.map(<[u8]>::to_vec),
                    OrderingKey::Field { tokens, .. } => field(r.value, tokens),
                };
                if let Some(k) = configured {
                    return (lane_of(r.origin, Tag::Key, &k), KeyFrom::Configured);
                }
                match r.record_key {
                    Some(k) => (lane_of(r.origin, Tag::Key, k), KeyFrom::RecordKey),
                    None => (partition_lane(r.origin), KeyFrom::Partition),
                }
            }
        }
    }
}

/// The lane of every job of its partition (`worker.ordering = "seller"`,
/// and a job with no key at all).
pub fn partition_lane(origin: &Position) -> Lane {
    lane_of(origin, Tag::Partition, &[])
}

/// Keeps a key from hashing like an offset or a bare partition.
#[derive(Hash)]
enum Tag {
    Partition,
    Key,
    Offset,
}

fn lane_of(origin: &Position, tag: Tag, bytes: &[u8]) -> Lane {
    // SipHash with fixed keys: the same lanes in every process and run
    // (the simulation replays a seed exactly).
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    origin.topic.hash(&mut h);
    origin.partition.hash(&mut h);
    tag.hash(&mut h);
    bytes.hash(&mut h);
    Lane(h.finish())
}

/// The member of the JSON `value` at the pointer's `tokens`: a string's
/// text, or any other value's JSON text (`12` and `"12"` are one key).
/// `None` when the value is not JSON, a step is missing, or the member is
/// `null`.
fn field(value: &[u8], tokens: &[String]) -> Option<Vec<u8>> {
    let mut at: &RawValue = serde_json::from_slice(value).ok()?;
    for token in tokens {
        let text = at.get();
        at = match text.as_bytes().first()? {
            b'{' => {
                let members: std::collections::HashMap<String, &RawValue> =
                    serde_json::from_str(text).ok()?;
                members.get(token.as_str()).copied()?
            }
            b'[' => {
                let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
                // RFC 6901: an index is digits with no leading zero.
                if token.len() > 1 && token.starts_with('0') {
                    return None;
                }
                *items.get(token.parse::<usize>().ok()?)?
            }
            _ => return None,
        };
    }
    let text = at.get();
    match text.as_bytes().first()? {
        b'n' => None,
        b'"' => serde_json::from_str::<String>(text)
            .ok()
            .map(String::into_bytes),
        _ => Some(text.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(partition: i32, offset: i64) -> Position {
        Position {
            topic: "jobs".into(),
            partition,
            offset,
        }
    }

    fn ordering(mode: OrderingMode, key: &str) -> Ordering {
        Ordering::new(mode, OrderingKey::parse(key).unwrap())
    }

    fn read<'a>(o: &'a Position, key: Option<&'a [u8]>, value: &'a str) -> Read<'a> {
        Read {
            origin: o,
            record_key: key,
            header: None,
            value: value.as_bytes(),
        }
    }

    #[test]
    fn the_pointer_reads_a_member_at_any_depth() {
        let v = br#"{"job_id":"j","payload":{"sku":"A-1","n":12,"tags":["x","y"],"a/b":{"~":true},"none":null}}"#;
        let get = |p: &str| match OrderingKey::parse(p).unwrap() {
            OrderingKey::Field { tokens, .. } => {
                field(v, &tokens).map(|b| String::from_utf8(b).unwrap())
            }
            _ => unreachable!(),
        };
        assert_eq!(get("/payload/sku").as_deref(), Some("A-1"));
        assert_eq!(get("/payload/n").as_deref(), Some("12"));
        assert_eq!(get("/payload/tags/1").as_deref(), Some("y"));
        assert_eq!(get("/payload/a~1b/~0").as_deref(), Some("true"));
        assert_eq!(get("/job_id").as_deref(), Some("j"));
        // Missing, null, out of range, a leading zero, through a scalar.
        for p in [
            "/payload/none",
            "/payload/gone",
            "/payload/tags/2",
            "/payload/tags/01",
            "/job_id/x",
        ] {
            assert_eq!(get(p), None, "{p}");
        }
    }

    #[test]
    fn a_source_is_a_pointer_the_record_key_or_a_header() {
        assert_eq!(OrderingKey::parse("record_key"), Ok(OrderingKey::RecordKey));
        assert_eq!(
            OrderingKey::parse("header:product-id"),
            Ok(OrderingKey::Header("product-id".into()))
        );
        for bad in ["sku", "header:", "/a/~2", ""] {
            let e = OrderingKey::parse(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    /// One product's jobs share a lane; another product's, another
    /// partition's, and (under `none`) every job have their own.
    #[test]
    fn lanes_follow_the_mode_and_the_key() {
        let by_key = ordering(OrderingMode::Key, "/payload/sku");
        let (o1, o2, o3) = (origin(0, 1), origin(0, 2), origin(1, 3));
        let a = r#"{"payload":{"sku":"A"}}"#;
        let b = r#"{"payload":{"sku":"B"}}"#;
        let lane = |o: &Position, k: Option<&[u8]>, v: &str| by_key.lane(read(o, k, v));
        assert_eq!(lane(&o1, None, a), lane(&o2, Some(b"seller-1"), a));
        assert_eq!(lane(&o1, None, a).1, KeyFrom::Configured);
        assert_ne!(lane(&o1, None, a).0, lane(&o2, None, b).0);
        assert_ne!(lane(&o1, None, a).0, lane(&o3, None, a).0);
        // No sku: the record key, then the partition.
        let bare = r#"{"payload":{}}"#;
        assert_eq!(lane(&o1, Some(b"k"), bare).1, KeyFrom::RecordKey);
        assert_eq!(lane(&o1, Some(b"k"), bare).0, lane(&o2, Some(b"k"), bare).0);
        assert_eq!(
            lane(&o1, None, bare),
            (partition_lane(&o1), KeyFrom::Partition)
        );
        // A key that reads like nothing else: not the partition's lane.
        assert_ne!(lane(&o1, Some(b""), bare).0, partition_lane(&o1));

        let seller = ordering(OrderingMode::Seller, "/payload/sku");
        assert_eq!(
            seller.lane(read(&o1, None, a)).0,
            seller.lane(read(&o2, None, b)).0
        );
        assert_ne!(
            seller.lane(read(&o1, None, a)).0,
            seller.lane(read(&o3, None, a)).0
        );

        let none = ordering(OrderingMode::None, "/payload/sku");
        assert_ne!(
            none.lane(read(&o1, None, a)).0,
            none.lane(read(&o2, None, a)).0
        );

        let header = ordering(OrderingMode::Key, "header:product");
        assert_eq!(header.header(), Some("product"));
        let with = Read {
            header: Some(b"A"),
            ..read(&o1, None, b)
        };
        assert_eq!(header.lane(with).1, KeyFrom::Configured);
        assert_eq!(
            ordering(OrderingMode::Seller, "header:product").header(),
            None
        );
    }
}
