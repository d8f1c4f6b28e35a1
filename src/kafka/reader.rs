//! Reading a whole topic from its beginning, outside any consumer group:
//! the demo tails the dead-letter topic with it and reads it to its end for
//! the summary, and `throttle-worker dlq` reads the dead letters.
//!
//! Partitions are assigned directly (no subscribe), so a reader never joins
//! a group, never commits and never causes a rebalance, and can start at
//! once on the mock broker, which holds every group join.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long one metadata or watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One record as read: where it sits, when it was written, its key and
/// headers. The value is left out unless the reader was asked to keep it
/// ([`TopicReader::keep_values`]): callers mostly count and classify, and a
/// payload has no business in their memory or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    /// The record's timestamp (Unix ms), if it has one.
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    /// Each header as (name, value as lossy UTF-8), in record order.
    pub headers: Vec<(String, String)>,
    pub value_len: usize,
    /// The value, with [`TopicReader::keep_values`] only.
    pub value: Option<Vec<u8>>,
}

impl ReadRecord {
    /// The last value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a topic could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    #[error("could not create a Kafka reader for brokers {brokers:?}: {reason}")]
    Create { brokers: String, reason: String },
    #[error("topic {topic:?}: {what}: {reason}")]
    Topic {
        topic: String,
        what: &'static str,
        reason: String,
    },
    #[error(
        "topic {topic:?} was not read to its end {ends:?} within {timeout:?} (read to {read_to:?})"
    )]
    Timeout {
        topic: String,
        ends: BTreeMap<i32, i64>,
        read_to: BTreeMap<i32, i64>,
        timeout: Duration,
    },
}

/// Reads every partition of one topic from offset 0. Blocking: run it on a
/// thread of its own.
pub struct TopicReader {
    consumer: BaseConsumer,
    topic: String,
    /// Next offset to read, per partition (what was read so far).
    read_to: BTreeMap<i32, i64>,
    keep_values: bool,
}

impl TopicReader {
    /// Assigns every partition of `topic` from its beginning.
    /// `properties` are the connection's librdkafka settings
    /// (`kafka.properties`).
    pub fn open(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        topic: &str,
    ) -> Result<TopicReader, ReaderError> {
        let reader = TopicReader::unassigned(brokers, properties, topic)?;
        let mut tpl = TopicPartitionList::new();
        for p in reader.read_to.keys() {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)
                .map_err(|e| reader.fail("assign", e))?;
        }
        reader
            .consumer
            .assign(&tpl)
            .map_err(|e| reader.fail("assign", e))?;
        Ok(reader)
    }

    /// A reader of `topic` that never reads it: it only asks for
    /// watermarks ([`TopicReader::high_watermark`],
    /// [`TopicReader::watermarks`]). A consumer that fetches answers those
    /// late: the broker answers a connection's requests in order, and a
    /// fetch at the end of a partition waits `fetch.wait.max.ms` (500 ms)
    /// for data. Unassigning a reader after [`TopicReader::open`] did not
    /// keep it from fetching: on the mock broker its fetches went on, and
    /// each watermark read waited up to 500 ms behind one (2.4 replayed
    /// records a second; BENCHMARKS.md, "DLQ replay rate").
    pub fn for_watermarks(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        topic: &str,
    ) -> Result<TopicReader, ReaderError> {
        TopicReader::unassigned(brokers, properties, topic)
    }

    /// The consumer, and the partitions of `topic` (from 0), not assigned.
    fn unassigned(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        topic: &str,
    ) -> Result<TopicReader, ReaderError> {
        let mut config = ClientConfig::new();
        for (k, v) in properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", brokers)
            // Required by the client even without a group join; never used
            // to commit.
            .set(
                "group.id",
                format!("throttle-reader-{:08x}", rand::random::<u32>()),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: BaseConsumer = config.create().map_err(|e| ReaderError::Create {
            brokers: brokers.to_owned(),
            reason: e.to_string(),
        })?;
        let mut reader = TopicReader {
            consumer,
            topic: topic.to_owned(),
            read_to: BTreeMap::new(),
            keep_values: false,
        };
        reader.read_to = reader.partitions()?.into_iter().map(|p| (p, 0)).collect();
        Ok(reader)
    }

    /// Reads only `partition` of `topic`, from `offset` on.
    pub fn open_partition(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<TopicReader, ReaderError> {
        let mut reader = TopicReader::unassigned(brokers, properties, topic)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
            .map_err(|e| reader.fail("assign", e))?;
        reader
            .consumer
            .assign(&tpl)
            .map_err(|e| reader.fail("assign", e))?;
        reader.read_to = BTreeMap::from([(partition, offset)]);
        Ok(reader)
    }

    /// The high watermark of `partition`: the offset the next record
    /// written to it gets.
    pub fn high_watermark(&self, partition: i32) -> Result<i64, ReaderError> {
        self.consumer
            .fetch_watermarks(&self.topic, partition, REQUEST_TIMEOUT)
            .map(|(_, high)| high)
            .map_err(|e| self.fail("watermarks", e))
    }

    /// Keeps each record's value in [`ReadRecord::value`].
    pub fn keep_values(mut self) -> TopicReader {
        self.keep_values = true;
        self
    }

    fn fail(&self, what: &'static str, e: impl std::fmt::Display) -> ReaderError {
        ReaderError::Topic {
            topic: self.topic.clone(),
            what,
            reason: e.to_string(),
        }
    }

    fn partitions(&self) -> Result<Vec<i32>, ReaderError> {
        let md = self
            .consumer
            .fetch_metadata(Some(&self.topic), REQUEST_TIMEOUT)
            .map_err(|e| self.fail("metadata", e))?;
        let topic = md
            .topics()
            .iter()
            .find(|t| t.name() == self.topic)
            .ok_or_else(|| self.fail("metadata", "no such topic"))?;
        if let Some(err) = topic.error() {
            return Err(self.fail("metadata", format!("{err:?}")));
        }
        Ok(topic.partitions().iter().map(|p| p.id()).collect())
    }

    /// The high watermark of every partition now: where "the end" is.
    pub fn end_offsets(&self) -> Result<BTreeMap<i32, i64>, ReaderError> {
        Ok(self
            .watermarks()?
            .into_iter()
            .map(|(p, (_, high))| (p, high))
            .collect())
    }

    /// The low and high watermark of every partition now: the records a
    /// read to the end goes through (for a progress bar).
    pub fn watermarks(&self) -> Result<BTreeMap<i32, (i64, i64)>, ReaderError> {
        self.read_to
            .keys()
            .map(|p| {
                self.consumer
                    .fetch_watermarks(&self.topic, *p, REQUEST_TIMEOUT)
                    .map(|marks| (*p, marks))
                    .map_err(|e| self.fail("watermarks", e))
            })
            .collect()
    }

    /// The records that arrive within `max_wait` (at least one poll), as
    /// many as are ready then.
    pub fn poll(&mut self, max_wait: Duration) -> Result<Vec<ReadRecord>, ReaderError> {
        let mut out = Vec::new();
        let mut wait = max_wait;
        while let Some(m) = self.consumer.poll(wait) {
            let m = m.map_err(|e| self.fail("read", e))?;
            self.read_to.insert(m.partition(), m.offset() + 1);
            out.push(ReadRecord {
                partition: m.partition(),
                offset: m.offset(),
                timestamp_ms: m.timestamp().to_millis(),
                key: m.key().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|hd| {
                                (
                                    hd.key.to_owned(),
                                    String::from_utf8_lossy(hd.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                value_len: m.payload().map_or(0, <[u8]>::len),
                value: self
                    .keep_values
                    .then(|| m.payload().unwrap_or_default().to_vec()),
            });
            // Take what is ready without waiting again.
            wait = Duration::ZERO;
        }
        Ok(out)
    }

    /// Reads until every partition is read up to `ends` (from
    /// [`TopicReader::end_offsets`]), or fails after `timeout`.
    pub fn read_to_end(
        &mut self,
        ends: &BTreeMap<i32, i64>,
        timeout: Duration,
    ) -> Result<Vec<ReadRecord>, ReaderError> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        while !self.reached(ends) {
            if Instant::now() >= deadline {
                return Err(ReaderError::Timeout {
                    topic: self.topic.clone(),
                    ends: ends.clone(),
                    read_to: self.read_to.clone(),
                    timeout,
                });
            }
            out.extend(self.poll(Duration::from_millis(100))?);
        }
        Ok(out)
    }

    /// Every partition read up to `ends`.
    pub fn reached(&self, ends: &BTreeMap<i32, i64>) -> bool {
        ends.iter()
            .all(|(p, end)| self.read_to.get(p).copied().unwrap_or(0) >= *end)
    }

    /// Next offset to read, per partition.
    pub fn read_to(&self) -> &BTreeMap<i32, i64> {
        &self.read_to
    }
}

/// How many records of `records` have each value of header `name`
/// (`None`: without it).
pub fn count_by_header<'a>(
    records: impl IntoIterator<Item = &'a ReadRecord>,
    name: &str,
) -> HashMap<Option<String>, usize> {
    let mut out = HashMap::new();
    for r in records {
        *out.entry(r.header(name).map(str::to_owned)).or_default() += 1;
    }
    out
}

// Every test here reads from the mock broker, a dev tool.
#[cfg(all(test, feature = "dev-tools"))]
mod tests {
    use super::*;
    use crate::kafka::{DevBroker, OriginalRecord, Position, RecordSink, Verdict};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_a_topic_to_its_end_with_keys_and_headers() {
        let topic = format!("read-{:08x}", rand::random::<u32>());
        let broker = DevBroker::start(&[(topic.clone(), 3)]).unwrap();
        let sink = RecordSink::new(broker.bootstrap_servers(), &BTreeMap::new()).unwrap();
        for i in 0..30 {
            let original = OriginalRecord {
                origin: Position {
                    topic: "jobs".into(),
                    partition: 0,
                    offset: i,
                },
                key: Some(format!("seller-{}/job-{i}", i % 3).into_bytes()),
                value: bytes::Bytes::from(vec![b'x'; 10]),
                trace: Default::default(),
            };
            let reason = if i % 2 == 0 { "not_json" } else { "missing_id" };
            sink.dead_letter(&topic, &original, &Verdict::bare(reason, reason, 0))
                .await
                .unwrap();
        }
        let bootstrap = broker.bootstrap_servers().to_owned();
        let records = tokio::task::spawn_blocking(move || {
            let mut reader = TopicReader::open(&bootstrap, &BTreeMap::new(), &topic).unwrap();
            let ends = reader.end_offsets().unwrap();
            assert_eq!(ends.values().sum::<i64>(), 30, "{ends:?}");
            let records = reader.read_to_end(&ends, Duration::from_secs(15)).unwrap();
            assert!(reader.reached(&ends));
            // Nothing more arrives: the end was the end.
            assert!(reader.poll(Duration::from_millis(200)).unwrap().is_empty());
            records
        })
        .await
        .unwrap();
        assert_eq!(records.len(), 30);
        let mut keys: Vec<String> = records
            .iter()
            .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 30, "each record once");
        assert!(records.iter().all(|r| r.value_len == 10));
        let reasons = count_by_header(&records, "x-error");
        assert_eq!(reasons[&Some("not_json".to_owned())], 15);
        assert_eq!(reasons[&Some("missing_id".to_owned())], 15);
    }

    #[test]
    fn a_missing_topic_is_named() {
        let broker = DevBroker::start(&[]).unwrap();
        let err = TopicReader::open(broker.bootstrap_servers(), &BTreeMap::new(), "nope")
            .err()
            .expect("no such topic");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }
}
