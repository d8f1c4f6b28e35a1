//! Writing records the worker could not finish in place: to the retry topic
//! (to be tried later) or to the dead-letter topic (never tried again).
//!
//! Both writes wait for the broker's acknowledgement, because the original
//! record only counts as finished — and its offset may only be committed —
//! once its copy is safely stored.
//!
//! Headers (values are decimal ASCII, except `x-error` which is UTF-8 text):
//!
//! | header                 | retry | DLQ | meaning                                  |
//! |------------------------|-------|-----|------------------------------------------|
//! | `x-not-before`         | yes   |     | Unix ms before which it must not be run  |
//! | `x-attempts`           | yes   | yes | downstream attempts made so far          |
//! | `x-error`              |       | yes | why it was dead-lettered                 |
//! | `x-error-kind`         |       | yes | the reason's kind (`attempts_exhausted`) |
//! | `x-seller-id`          |       | yes | the job's seller, when the job parsed    |
//! | `x-job-id`             |       | yes | the job's id, when the job parsed        |
//! | `x-original-topic`     | yes   | yes | where the job first entered, ...         |
//! | `x-original-partition` | yes   | yes | ... kept across retry-topic round trips  |
//! | `x-original-offset`    | yes   | yes |                                          |
//! | `traceparent`          | yes   | yes | the original record's, unchanged, if any |
//! | `tracestate`           | yes   | yes | the original record's, unchanged, if any |
//!
//! The W3C trace headers are copied as they were (even an invalid
//! traceparent), so a job that goes round the retry topic stays in its
//! trace, and a dead letter can be found from the producer's trace.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Message};

use crate::telemetry::traceparent::TraceHeaders;

pub const X_ERROR: &str = "x-error";
/// The dead letter's reason kind: the `kind` label of
/// `throttle_jobs_dead_lettered_total`, so that `dlq stats` and the metric
/// count alike.
pub const X_ERROR_KIND: &str = "x-error-kind";
pub const X_SELLER_ID: &str = "x-seller-id";
pub const X_JOB_ID: &str = "x-job-id";
/// On a jobs-topic record written by `dlq replay`: the dead letter it was
/// replayed from, `<topic>:<partition>:<offset>`.
pub const X_REPLAYED_FROM: &str = "x-replayed-from";
pub const X_ATTEMPTS: &str = "x-attempts";
pub const X_NOT_BEFORE: &str = "x-not-before";
/// When a retry-tier record may be taken up (written + the tier's delay):
/// ascending within a tier's partition, so holding the head never holds
/// back a record that is due earlier.
pub const X_RELEASE_AT: &str = "x-release-at";
pub const X_ORIGINAL_TOPIC: &str = "x-original-topic";
pub const X_ORIGINAL_PARTITION: &str = "x-original-partition";
pub const X_ORIGINAL_OFFSET: &str = "x-original-offset";

/// `x-error` is a header, not a log: keep it bounded.
const MAX_ERROR_HEADER_BYTES: usize = 1024;

/// What a dead letter says of itself, in its headers.
#[derive(Debug, Clone, Copy)]
pub struct Verdict<'a> {
    /// A short fixed label (`attempts_exhausted`, `not_json`, ...).
    pub kind: &'a str,
    /// Why, for people (bounded to 1 KiB in the header).
    pub reason: &'a str,
    /// Downstream attempts made.
    pub attempts: u32,
    /// The job's seller and id, when the record parsed as a job.
    pub seller: Option<&'a str>,
    pub job_id: Option<&'a str>,
}

impl<'a> Verdict<'a> {
    /// A verdict on a record that did not parse as a job.
    pub fn bare(kind: &'a str, reason: &'a str, attempts: u32) -> Verdict<'a> {
        Verdict {
            kind,
            reason,
            attempts,
            seller: None,
            job_id: None,
        }
    }
}

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("could not create the Kafka producer for brokers {brokers:?}: {reason}")]
    Create { brokers: String, reason: String },
    #[error("broker did not acknowledge the record for topic {topic:?}: {reason}")]
    Delivery { topic: String, reason: String },
    /// Over the producer's `message.max.bytes` or the broker's limit: the
    /// same record will never be accepted.
    #[error("record too large for topic {topic:?}: {reason}")]
    TooLarge { topic: String, reason: String },
}

/// A delivery error, with the size refusals told apart (they are final).
fn delivery_error(topic: &str, e: &KafkaError) -> SinkError {
    let too_large = matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    );
    if too_large {
        SinkError::TooLarge {
            topic: topic.to_owned(),
            reason: e.to_string(),
        }
    } else {
        SinkError::Delivery {
            topic: topic.to_owned(),
            reason: e.to_string(),
        }
    }
}

/// Where a record sits in Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// The record a retry or dead letter is a copy of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginalRecord {
    /// Where the job first entered: for a record consumed from the retry
    /// topic, the position named by its `x-original-*` headers, so a job
    /// that went round the retry topic is still traceable to its source.
    pub origin: Position,
    pub key: Option<Vec<u8>>,
    /// The record value, byte for byte; shared (not copied) with the job
    /// parsed from it.
    pub value: Bytes,
    /// Its `traceparent` and `tracestate` headers, as they were.
    pub trace: TraceHeaders,
}

impl OriginalRecord {
    /// Copies a consumed record, resolving its origin as described on
    /// [`OriginalRecord::origin`].
    pub fn from_message<M: Message>(message: &M) -> OriginalRecord {
        let here = Position {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
        };
        let origin = message
            .headers()
            .and_then(|h| RetryHeaders::from_headers(header_pairs(h)).ok())
            .and_then(|h| h.original)
            .unwrap_or(here);
        OriginalRecord {
            origin,
            key: message.key().map(<[u8]>::to_vec),
            value: message
                .payload()
                .map(Bytes::copy_from_slice)
                .unwrap_or_default(),
            trace: message
                .headers()
                .map(|h| TraceHeaders::from_pairs(header_pairs(h)))
                .unwrap_or_default(),
        }
    }
}

/// A header of [`RetryHeaders`] that is present but unreadable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {name} has value {value:?}, expected {expected}")]
pub struct HeaderError {
    pub name: &'static str,
    /// Lossy UTF-8 of the raw value.
    pub value: String,
    pub expected: &'static str,
}

/// The worker's headers read back from a consumed record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryHeaders {
    /// `x-not-before`; `None` on records that never went to the retry topic.
    pub not_before_unix_ms: Option<u64>,
    /// `x-release-at`; `None` on records not written to a retry tier by
    /// this worker (they are taken up at once).
    pub release_at_unix_ms: Option<u64>,
    /// `x-attempts`; 0 when absent (a fresh job).
    pub attempts: u32,
    /// `x-error`, if present.
    pub error: Option<String>,
    /// All three `x-original-*` headers, or `None` if any is absent.
    pub original: Option<Position>,
}

impl RetryHeaders {
    /// Reads the worker's headers from `(name, value)` pairs; other headers
    /// are ignored, and for a repeated name the last one wins (Kafka
    /// headers are a list, and appenders add at the end).
    pub fn from_headers<'a>(
        headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) -> Result<RetryHeaders, HeaderError> {
        let mut out = RetryHeaders::default();
        let (mut topic, mut partition, mut offset) = (None, None, None);
        for (name, value) in headers {
            let Some(value) = value else { continue };
            match name {
                X_NOT_BEFORE => out.not_before_unix_ms = Some(number(X_NOT_BEFORE, value)?),
                X_RELEASE_AT => out.release_at_unix_ms = Some(number(X_RELEASE_AT, value)?),
                X_ATTEMPTS => out.attempts = number(X_ATTEMPTS, value)?,
                X_ERROR => out.error = Some(String::from_utf8_lossy(value).into_owned()),
                X_ORIGINAL_TOPIC => topic = Some(String::from_utf8_lossy(value).into_owned()),
                X_ORIGINAL_PARTITION => partition = Some(number(X_ORIGINAL_PARTITION, value)?),
                X_ORIGINAL_OFFSET => offset = Some(number(X_ORIGINAL_OFFSET, value)?),
                _ => {}
            }
        }
        if let (Some(topic), Some(partition), Some(offset)) = (topic, partition, offset) {
            out.original = Some(Position {
                topic,
                partition,
                offset,
            });
        }
        Ok(out)
    }
}

fn number<T: std::str::FromStr>(name: &'static str, value: &[u8]) -> Result<T, HeaderError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HeaderError {
            name,
            value: String::from_utf8_lossy(value).into_owned(),
            expected: "a decimal number",
        })
}

/// Adapts rdkafka headers to the pairs [`RetryHeaders::from_headers`] reads.
pub fn header_pairs<H: Headers>(headers: &H) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
    headers.iter().map(|h| (h.key, h.value))
}

/// Writes retry and dead-letter records through one idempotent producer.
pub struct RecordSink {
    producer: FutureProducer,
}

impl RecordSink {
    /// `properties` are passed to librdkafka as they are (SASL, SSL,
    /// tuning); `enable.idempotence` and `acks` are then forced, because
    /// at-least-once depends on them.
    pub fn new(
        brokers: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<RecordSink, SinkError> {
        let mut config = ClientConfig::new();
        for (k, v) in properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        let producer = config.create().map_err(|e| SinkError::Create {
            brokers: brokers.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(RecordSink { producer })
    }

    /// Writes `original` to `dlq_topic` with what `verdict` says of it, and
    /// waits for the broker's acknowledgement.
    pub async fn dead_letter(
        &self,
        dlq_topic: &str,
        original: &OriginalRecord,
        verdict: &Verdict<'_>,
    ) -> Result<(), SinkError> {
        let mut headers = origin_headers(&original.origin)
            .insert(text(
                X_ERROR,
                truncate(verdict.reason, MAX_ERROR_HEADER_BYTES),
            ))
            .insert(text(X_ERROR_KIND, verdict.kind))
            .insert(text(X_ATTEMPTS, &verdict.attempts.to_string()));
        if let Some(seller) = verdict.seller {
            headers = headers.insert(text(X_SELLER_ID, seller));
        }
        if let Some(job_id) = verdict.job_id {
            headers = headers.insert(text(X_JOB_ID, job_id));
        }
        self.send(dlq_topic, original, headers).await
    }

    /// Writes `original` to a retry tier's topic, to be taken up at
    /// `release_at_unix_ms` and not run before `not_before_unix_ms`, and waits
    /// for the broker's acknowledgement.
    pub async fn to_retry_topic(
        &self,
        retry_topic: &str,
        original: &OriginalRecord,
        not_before_unix_ms: u64,
        release_at_unix_ms: u64,
        attempts: u32,
    ) -> Result<(), SinkError> {
        let headers = origin_headers(&original.origin)
            .insert(text(X_NOT_BEFORE, &not_before_unix_ms.to_string()))
            .insert(text(X_RELEASE_AT, &release_at_unix_ms.to_string()))
            .insert(text(X_ATTEMPTS, &attempts.to_string()));
        self.send(retry_topic, original, headers).await
    }

    /// Writes one record to `partition` of `topic` with `headers`, and waits
    /// for the broker's acknowledgement; returns its offset.
    pub async fn produce_to(
        &self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> Result<i64, SinkError> {
        let mut h = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            h = h.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        let mut record = FutureRecord::to(topic)
            .partition(partition)
            .payload(value)
            .headers(h);
        if let Some(key) = key {
            record = record.key(key);
        }
        match self.producer.send(record, Timeout::Never).await {
            Ok(delivery) => Ok(delivery.offset),
            Err((e, _)) => Err(SinkError::Delivery {
                topic: topic.to_owned(),
                reason: e.to_string(),
            }),
        }
    }

    /// Writes one record as it is (the load generator's jobs) and waits for
    /// the broker's acknowledgement.
    pub async fn produce(&self, topic: &str, key: &[u8], value: &[u8]) -> Result<(), SinkError> {
        let record = FutureRecord::to(topic).key(key).payload(value);
        match self.producer.send(record, Timeout::Never).await {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(SinkError::Delivery {
                topic: topic.to_owned(),
                reason: e.to_string(),
            }),
        }
    }

    async fn send(
        &self,
        topic: &str,
        original: &OriginalRecord,
        mut headers: OwnedHeaders,
    ) -> Result<(), SinkError> {
        for (key, value) in original.trace.pairs() {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record = FutureRecord::to(topic)
            .payload(&original.value[..])
            .headers(headers);
        if let Some(key) = &original.key {
            record = record.key(key.as_slice());
        }
        // Never give up on a full local queue: delivery itself is bounded
        // by librdkafka's message.timeout.ms, which reports an error.
        match self.producer.send(record, Timeout::Never).await {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(delivery_error(topic, &e)),
        }
    }

    /// Waits up to `timeout` for queued records to be acknowledged (on
    /// shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        use rdkafka::producer::Producer;
        self.producer
            .flush(timeout)
            .map_err(|e| SinkError::Delivery {
                topic: "(flush)".to_owned(),
                reason: e.to_string(),
            })
    }
}

fn origin_headers(origin: &Position) -> OwnedHeaders {
    OwnedHeaders::new_with_capacity(8)
        .insert(text(X_ORIGINAL_TOPIC, &origin.topic))
        .insert(text(X_ORIGINAL_PARTITION, &origin.partition.to_string()))
        .insert(text(X_ORIGINAL_OFFSET, &origin.offset.to_string()))
}

fn text<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "dev-tools")]
    use crate::kafka::mock::DevBroker;
    #[cfg(feature = "dev-tools")]
    use rdkafka::consumer::{Consumer, StreamConsumer};

    type Pairs<'a> = Vec<(&'a str, &'a [u8])>;

    #[cfg(feature = "dev-tools")]
    fn unique(prefix: &str) -> String {
        format!("{prefix}-{}", rand::random::<u64>())
    }

    #[test]
    fn headers_read_back() {
        let pairs: Vec<(&str, Option<&[u8]>)> = vec![
            ("traceparent", Some(b"00-abc")),
            (X_NOT_BEFORE, Some(b"1700000000123")),
            (X_RELEASE_AT, Some(b"1700000000100")),
            (X_ATTEMPTS, Some(b"2")),
            (X_ATTEMPTS, Some(b"3")),
            (X_ORIGINAL_TOPIC, Some(b"jobs")),
            (X_ORIGINAL_PARTITION, Some(b"4")),
            (X_ORIGINAL_OFFSET, Some(b"99")),
            (X_ERROR, None),
        ];
        let h = RetryHeaders::from_headers(pairs).unwrap();
        let want = RetryHeaders {
            not_before_unix_ms: Some(1_700_000_000_123),
            release_at_unix_ms: Some(1_700_000_000_100),
            attempts: 3,
            error: None,
            original: Some(Position {
                topic: "jobs".into(),
                partition: 4,
                offset: 99,
            }),
        };
        assert_eq!(h, want);
    }

    #[test]
    fn header_table() {
        let cases: Vec<(u32, Pairs, Result<RetryHeaders, HeaderError>)> = vec![
            (1, vec![], Ok(RetryHeaders::default())),
            (
                2,
                vec![(X_ATTEMPTS, b"1")],
                Ok(RetryHeaders {
                    attempts: 1,
                    ..Default::default()
                }),
            ),
            (
                3,
                vec![(X_ORIGINAL_TOPIC, b"jobs"), (X_ORIGINAL_OFFSET, b"1")],
                Ok(RetryHeaders::default()),
            ),
            (
                4,
                vec![(X_ERROR, "caf\u{e9}".as_bytes())],
                Ok(RetryHeaders {
                    error: Some("caf\u{e9}".into()),
                    ..Default::default()
                }),
            ),
            (
                5,
                vec![(X_ATTEMPTS, b"-1")],
                Err(HeaderError {
                    name: X_ATTEMPTS,
                    value: "-1".into(),
                    expected: "a decimal number",
                }),
            ),
            (
                6,
                vec![(X_NOT_BEFORE, b"soon")],
                Err(HeaderError {
                    name: X_NOT_BEFORE,
                    value: "soon".into(),
                    expected: "a decimal number",
                }),
            ),
            (
                7,
                vec![(X_ORIGINAL_PARTITION, b"\xff")],
                Err(HeaderError {
                    name: X_ORIGINAL_PARTITION,
                    value: "\u{fffd}".into(),
                    expected: "a decimal number",
                }),
            ),
        ];
        for (row, pairs, want) in cases {
            let got = RetryHeaders::from_headers(pairs.into_iter().map(|(k, v)| (k, Some(v))));
            assert_eq!(got, want, "row {row}");
        }
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abc", 2), "ab");
        assert_eq!(truncate("\u{e9}\u{e9}", 3), "\u{e9}");
    }

    #[cfg(feature = "dev-tools")]
    async fn read_one(bootstrap: &str, topic: &str) -> rdkafka::message::OwnedMessage {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", unique("reader"))
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let msg = tokio::time::timeout(Duration::from_secs(15), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("nothing on {topic} after 15 s"))
            .unwrap();
        msg.detach()
    }

    #[cfg(feature = "dev-tools")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_letter_and_retry_round_trip() {
        let (jobs, dlq, retry) = (unique("jobs"), unique("dlq"), unique("retry"));
        let broker =
            DevBroker::start(&[(jobs.clone(), 3), (dlq.clone(), 1), (retry.clone(), 1)]).unwrap();
        let sink = RecordSink::new(broker.bootstrap_servers(), &BTreeMap::new()).unwrap();
        // Not valid JSON, not UTF-8, with a NUL: must survive byte for byte.
        let value = b"{\"job_id\": \xff\x00 broken".to_vec();
        let original = OriginalRecord {
            origin: Position {
                topic: jobs.clone(),
                partition: 2,
                offset: 41,
            },
            key: Some(b"seller-7".to_vec()),
            value: value.clone().into(),
            // Copied as they were, valid or not.
            trace: TraceHeaders {
                traceparent: Some(
                    b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec(),
                ),
                tracestate: Some(b"not even checked".to_vec()),
            },
        };
        let verdict = Verdict {
            kind: "attempts_exhausted",
            reason: "record value is not valid UTF-8 (invalid byte at offset 12)",
            attempts: 0,
            seller: Some("seller-7"),
            job_id: Some("job-42"),
        };
        sink.dead_letter(&dlq, &original, &verdict)
            .await
            .expect("dead letter acknowledged");
        let got = read_one(broker.bootstrap_servers(), &dlq).await;
        assert_eq!(got.payload(), Some(value.as_slice()), "value byte for byte");
        assert_eq!(got.key(), Some(&b"seller-7"[..]), "original key kept");
        let h = RetryHeaders::from_headers(header_pairs(got.headers().expect("headers"))).unwrap();
        assert_eq!(
            h.error.as_deref(),
            Some("record value is not valid UTF-8 (invalid byte at offset 12)")
        );
        assert_eq!(h.attempts, 0);
        assert_eq!(h.not_before_unix_ms, None);
        assert_eq!(h.original, Some(original.origin.clone()));
        let named: Vec<(&str, Option<&[u8]>)> = header_pairs(got.headers().unwrap())
            .filter(|(k, _)| [X_ERROR_KIND, X_SELLER_ID, X_JOB_ID].contains(k))
            .collect();
        assert_eq!(
            named,
            vec![
                (X_ERROR_KIND, Some(&b"attempts_exhausted"[..])),
                (X_SELLER_ID, Some(&b"seller-7"[..])),
                (X_JOB_ID, Some(&b"job-42"[..])),
            ],
            "the kind, seller and job id travel as headers"
        );
        assert_eq!(
            OriginalRecord::from_message(&got).trace,
            original.trace,
            "trace headers kept on the dead letter"
        );

        sink.to_retry_topic(&retry, &original, 1_700_000_000_500, 1_700_000_000_400, 2)
            .await
            .expect("retry acknowledged");
        let got = read_one(broker.bootstrap_servers(), &retry).await;
        assert_eq!(got.payload(), Some(value.as_slice()));
        let h = RetryHeaders::from_headers(header_pairs(got.headers().expect("headers"))).unwrap();
        assert_eq!(h.not_before_unix_ms, Some(1_700_000_000_500));
        assert_eq!(h.release_at_unix_ms, Some(1_700_000_000_400));
        assert_eq!(h.attempts, 2);
        assert_eq!(h.error, None);
        // Consumed from the retry topic, the origin is still the jobs topic.
        let again = OriginalRecord::from_message(&got);
        assert_eq!(
            again.origin, original.origin,
            "origin survives the retry topic"
        );
        assert_eq!(again.value, value);
        assert_eq!(
            again.trace, original.trace,
            "trace headers kept on the retry topic"
        );
        sink.flush(Duration::from_secs(5)).unwrap();
    }

    #[tokio::test]
    async fn unreachable_broker_is_a_delivery_error() {
        // A free loopback port: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut props = BTreeMap::new();
        props.insert("message.timeout.ms".to_owned(), "500".to_owned());
        let sink = RecordSink::new(&format!("127.0.0.1:{port}"), &props).unwrap();
        let original = OriginalRecord {
            origin: Position {
                topic: "jobs".into(),
                partition: 0,
                offset: 0,
            },
            key: None,
            value: bytes::Bytes::from_static(b"{}"),
            trace: TraceHeaders::default(),
        };
        let err = sink
            .dead_letter("dlq", &original, &Verdict::bare("test", "x", 1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("\"dlq\""), "{err}");
    }
}
