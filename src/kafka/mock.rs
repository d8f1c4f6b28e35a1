//! An embedded Kafka broker: librdkafka's mock cluster, for tests, the demo
//! and `throttle-worker dev-broker`.
//!
//! The mock speaks the Kafka protocol on loopback ports (producing,
//! consuming, consumer groups, offset commits) but has no Admin API, so
//! topics are created here through the mock's own API.
//!
//! Group timing on the mock (classic protocol, librdkafka 2.12): the first
//! join of an empty group waits the *initial rebalance delay* (3 s by
//! default; [`DevBroker`] sets it to 0). A join or leave in a group that
//! already has members waits `session.timeout.ms - 1000` before the new
//! assignment, so consumers used against the mock should set a short
//! `session.timeout.ms` (a few seconds) to rebalance quickly.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr, RDKafkaType};
use rdkafka::ClientConfig;

/// Kafka's limit on topic name length.
const MAX_TOPIC_NAME: usize = 249;

/// More partitions than this on one mock topic is almost surely a typo.
const MAX_PARTITIONS: i32 = 10_000;

/// Why the mock broker could not start or be used.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    #[error("could not start the mock Kafka cluster: {0}")]
    Start(String),
    #[error("the client was created without a mock cluster (test.mock.num.brokers not honoured)")]
    NoCluster,
    #[error("could not create mock topic {topic:?} with {partitions} partitions: {reason}")]
    CreateTopic {
        topic: String,
        partitions: i32,
        reason: String,
    },
    #[error(transparent)]
    Spec(#[from] TopicSpecError),
    #[error("could not write the bootstrap.servers line to stdout: {0}")]
    Stdout(#[from] std::io::Error),
}

/// Why a `NAME:PARTITIONS` topic spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicSpecError {
    #[error("topic spec {0:?} has no ':'; expected NAME:PARTITIONS, e.g. jobs:8")]
    NoColon(String),
    #[error("topic spec {0:?} has an empty name; expected NAME:PARTITIONS, e.g. jobs:8")]
    EmptyName(String),
    #[error("topic name {0:?} may only contain ASCII letters, digits, '.', '_' and '-', and may not be '.' or '..'")]
    BadName(String),
    #[error("topic name is {0} characters; Kafka allows at most 249")]
    NameTooLong(usize),
    #[error(
        "topic spec {spec:?}: partitions {partitions:?} is not a whole number between 1 and 10000"
    )]
    BadPartitions { spec: String, partitions: String },
}

/// Parses `NAME:PARTITIONS`, e.g. `jobs:8`.
///
/// ```
/// use throttle_worker::kafka::mock::parse_topic_spec;
///
/// assert_eq!(parse_topic_spec("jobs:8"), Ok(("jobs".to_owned(), 8)));
/// assert!(parse_topic_spec("jobs").is_err());
/// ```
pub fn parse_topic_spec(spec: &str) -> Result<(String, i32), TopicSpecError> {
    // Split at the last ':' so the message for "a:b:3" is about the name.
    let (name, partitions) = spec
        .rsplit_once(':')
        .ok_or_else(|| TopicSpecError::NoColon(spec.to_owned()))?;
    check_topic_name(name).map_err(|e| match e {
        TopicSpecError::EmptyName(_) => TopicSpecError::EmptyName(spec.to_owned()),
        other => other,
    })?;
    let count = partitions
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|n| (1..=MAX_PARTITIONS).contains(n))
        .ok_or_else(|| TopicSpecError::BadPartitions {
            spec: spec.to_owned(),
            partitions: partitions.to_owned(),
        })?;
    Ok((name.to_owned(), count))
}

fn check_topic_name(name: &str) -> Result<(), TopicSpecError> {
    if name.is_empty() {
        return Err(TopicSpecError::EmptyName(name.to_owned()));
    }
    if name.len() > MAX_TOPIC_NAME {
        return Err(TopicSpecError::NameTooLong(name.len()));
    }
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !name.chars().all(legal) || name == "." || name == ".." {
        return Err(TopicSpecError::BadName(name.to_owned()));
    }
    Ok(())
}

/// The id of the mock's one broker.
const BROKER_ID: i32 = 1;

/// A running mock cluster with one broker. The cluster lives exactly as
/// long as this value.
pub struct DevBroker {
    /// A client created with `test.mock.num.brokers`: librdkafka owns the
    /// mock cluster inside it and destroys it when the client is dropped.
    /// Holding the client (rather than a `MockCluster`, which borrows it or
    /// holds a raw pointer) keeps `DevBroker` `Send + Sync`.
    client: Client<DefaultClientContext>,
    /// The cluster's `host:port` list, read once at start.
    bootstrap: String,
}

impl std::fmt::Debug for DevBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevBroker")
            .field("bootstrap", &self.bootstrap)
            .finish()
    }
}

impl DevBroker {
    /// Starts the mock cluster on loopback, creates each `(name, partitions)`
    /// topic and makes groups form without the initial rebalance delay.
    pub fn start(topics: &[(String, i32)]) -> Result<DevBroker, MockError> {
        let mut config = ClientConfig::new();
        config
            .set("test.mock.num.brokers", "1")
            .set_log_level(RDKafkaLogLevel::Warning);
        let native = config
            .create_native_config()
            .map_err(|e| MockError::Start(e.to_string()))?;
        let client = Client::new(
            &config,
            native,
            RDKafkaType::RD_KAFKA_PRODUCER,
            DefaultClientContext,
        )
        .map_err(|e| MockError::Start(e.to_string()))?;
        let bootstrap = client
            .mock_cluster()
            .ok_or(MockError::NoCluster)?
            .bootstrap_servers();
        let broker = DevBroker { client, bootstrap };
        broker.tune_groups()?;
        for (name, partitions) in topics {
            broker.create_topic(name, *partitions)?;
        }
        Ok(broker)
    }

    /// The `bootstrap.servers` value for clients of this cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Creates a topic (replication factor 1: there is one broker).
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), MockError> {
        let fail = |reason: String| MockError::CreateTopic {
            topic: name.to_owned(),
            partitions,
            reason,
        };
        check_topic_name(name).map_err(|e| fail(e.to_string()))?;
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            return Err(fail("partitions must be between 1 and 10000".to_owned()));
        }
        let cluster = self.client.mock_cluster().ok_or(MockError::NoCluster)?;
        cluster
            .create_topic(name, partitions, 1)
            .map_err(|e| fail(e.to_string()))
    }

    /// Fault injection for tests and rehearsals: the broker stops answering
    /// (connections are closed and refused) until [`DevBroker::broker_up`].
    pub fn broker_down(&self) -> Result<(), MockError> {
        let cluster = self.client.mock_cluster().ok_or(MockError::NoCluster)?;
        cluster
            .broker_down(BROKER_ID)
            .map_err(|e| MockError::Start(e.to_string()))
    }

    /// Ends [`DevBroker::broker_down`].
    pub fn broker_up(&self) -> Result<(), MockError> {
        let cluster = self.client.mock_cluster().ok_or(MockError::NoCluster)?;
        cluster
            .broker_up(BROKER_ID)
            .map_err(|e| MockError::Start(e.to_string()))
    }

    /// The next `errors.len()` requests of kind `api` fail with these
    /// errors, in order (a flaky broker or coordinator).
    pub fn fail_next_requests(
        &self,
        api: RDKafkaApiKey,
        errors: &[RDKafkaRespErr],
    ) -> Result<(), MockError> {
        let cluster = self.client.mock_cluster().ok_or(MockError::NoCluster)?;
        cluster.request_errors(api, errors);
        Ok(())
    }

    /// Delays every response of the broker by `rtt` (a slow or distant
    /// broker); `Duration::ZERO` ends it.
    pub fn set_round_trip_time(&self, rtt: Duration) -> Result<(), MockError> {
        let cluster = self.client.mock_cluster().ok_or(MockError::NoCluster)?;
        cluster
            .broker_round_trip_time(BROKER_ID, rtt)
            .map_err(|e| MockError::Start(e.to_string()))
    }

    /// The broker's answers to the next `count` requests of kind `api` wait
    /// `delay`. The requests themselves are handled at once (a delayed
    /// Produce is written; only its acknowledgement waits), and a
    /// connection's answers leave in order, so the ones behind a delayed
    /// answer wait for it too: one delayed Produce holds back every
    /// acknowledgement of that producer for `delay`.
    pub fn delay_answers(
        &self,
        api: RDKafkaApiKey,
        count: usize,
        delay: Duration,
    ) -> Result<(), MockError> {
        let ms = libc::c_int::try_from(delay.as_millis()).unwrap_or(libc::c_int::MAX);
        for _ in 0..count {
            // SAFETY: as in `tune_groups`: the cluster is owned by
            // `self.client` and checked for null. The variadic arguments
            // are the one (error, rtt in ms) pair that `cnt = 1` announces,
            // as the C side reads them: `rd_kafka_resp_err_t` (an int-sized
            // enum) and `int`.
            let err = unsafe {
                let cluster = rdsys::rd_kafka_handle_mock_cluster(self.client.native_ptr());
                if cluster.is_null() {
                    return Err(MockError::NoCluster);
                }
                rdsys::rd_kafka_mock_broker_push_request_error_rtts(
                    cluster,
                    BROKER_ID,
                    api as i16,
                    1,
                    RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR as libc::c_int,
                    ms,
                )
            };
            if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                return Err(MockError::Start(format!(
                    "could not delay {api:?} answers: {err:?}"
                )));
            }
        }
        Ok(())
    }

    /// Groups form at once (no initial rebalance delay), and groups of the
    /// KIP-848 consumer protocol (`group.protocol=consumer`), whose session
    /// timeout is the broker's to set, notice a lost member after 3 s
    /// instead of the mock's 30 s, as classic groups do with the short
    /// `session.timeout.ms` local runs use.
    fn tune_groups(&self) -> Result<(), MockError> {
        // SAFETY: `native_ptr` is the live handle owned by `self.client`, so
        // `rd_kafka_handle_mock_cluster` may read it; the returned cluster is
        // owned by that same client and stays valid while `self` lives. It is
        // checked for null before use. The setters only store integers
        // under the cluster's own mutex, so calling them from this thread while
        // the mock's thread runs is sound. rust-rdkafka 0.39's `MockCluster`
        // does not wrap these setters, hence the direct FFI calls.
        unsafe {
            let cluster = rdsys::rd_kafka_handle_mock_cluster(self.client.native_ptr());
            if cluster.is_null() {
                return Err(MockError::NoCluster);
            }
            rdsys::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, 0);
            rdsys::rd_kafka_mock_set_group_consumer_session_timeout_ms(cluster, 3000);
            rdsys::rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(cluster, 300);
        }
        Ok(())
    }
}

/// `throttle-worker dev-broker`: starts the mock, prints
/// `bootstrap.servers=<list>` as the first stdout line (flushed, so a parent
/// process can read it at once), then serves until `shutdown` resolves.
pub async fn serve_dev_broker(
    topics: Vec<(String, i32)>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MockError> {
    serve_to(&topics, shutdown, &mut std::io::stdout()).await
}

async fn serve_to(
    topics: &[(String, i32)],
    shutdown: impl Future<Output = ()>,
    out: &mut (dyn Write + Send),
) -> Result<(), MockError> {
    let broker = DevBroker::start(topics)?;
    writeln!(out, "bootstrap.servers={}", broker.bootstrap_servers())?;
    out.flush()?;
    tracing::info!(
        bootstrap_servers = broker.bootstrap_servers(),
        topics = ?topics,
        "dev broker serving"
    );
    shutdown.await;
    tracing::info!("dev broker stopping");
    drop(broker);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::Message;

    type SpecResult = Result<(String, i32), TopicSpecError>;

    pub(crate) fn unique(prefix: &str) -> String {
        format!("{prefix}-{}", rand::random::<u64>())
    }

    fn producer(bootstrap: &str) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .expect("producer for the mock")
    }

    fn consumer(bootstrap: &str, group: &str) -> StreamConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .create()
            .expect("consumer for the mock")
    }

    #[test]
    fn topic_specs() {
        use TopicSpecError::*;
        let cases: Vec<(u32, &str, SpecResult)> = vec![
            (1, "jobs:8", Ok(("jobs".into(), 8))),
            (2, "jobs.retry_v2-x:1", Ok(("jobs.retry_v2-x".into(), 1))),
            (3, "jobs", Err(NoColon("jobs".into()))),
            (4, ":3", Err(EmptyName(":3".into()))),
            (
                5,
                "jobs:",
                Err(BadPartitions {
                    spec: "jobs:".into(),
                    partitions: "".into(),
                }),
            ),
            (
                6,
                "jobs:0",
                Err(BadPartitions {
                    spec: "jobs:0".into(),
                    partitions: "0".into(),
                }),
            ),
            (
                7,
                "jobs:-2",
                Err(BadPartitions {
                    spec: "jobs:-2".into(),
                    partitions: "-2".into(),
                }),
            ),
            (
                8,
                "jobs:many",
                Err(BadPartitions {
                    spec: "jobs:many".into(),
                    partitions: "many".into(),
                }),
            ),
            (
                9,
                "jobs:10001",
                Err(BadPartitions {
                    spec: "jobs:10001".into(),
                    partitions: "10001".into(),
                }),
            ),
            (10, "my topic:3", Err(BadName("my topic".into()))),
            (11, "a:b:3", Err(BadName("a:b".into()))),
            (12, "..:3", Err(BadName("..".into()))),
        ];
        for (row, spec, want) in cases {
            assert_eq!(parse_topic_spec(spec), want, "row {row}: {spec:?}");
        }
        let long = format!("{}:1", "t".repeat(250));
        assert_eq!(parse_topic_spec(&long), Err(NameTooLong(250)));
        assert!(NoColon("x".into()).to_string().contains("NAME:PARTITIONS"));
    }

    #[test]
    fn bad_topics_fail_start() {
        let err = DevBroker::start(&[("ok".into(), 1), ("bad".into(), 0)]).unwrap_err();
        assert!(
            err.to_string().contains("\"bad\" with 0 partitions"),
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn produce_and_consume_100_records_in_a_group() {
        let topic = unique("jobs");
        let broker = DevBroker::start(&[(topic.clone(), 4)]).expect("mock starts");
        assert!(
            broker.bootstrap_servers().starts_with("127.0.0.1:"),
            "{}",
            broker.bootstrap_servers()
        );
        let producer = producer(broker.bootstrap_servers());
        for i in 0..100 {
            let key = format!("k{i}");
            let value = format!("v{i}");
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&value),
                    Duration::from_secs(5),
                )
                .await
                .unwrap_or_else(|(e, _)| panic!("record {i} not acknowledged: {e}"));
        }
        let consumer = consumer(broker.bootstrap_servers(), &unique("group"));
        consumer.subscribe(&[&topic]).unwrap();
        let mut seen = HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.len() < 100 {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = tokio::time::timeout(left, consumer.recv())
                .await
                .unwrap_or_else(|_| panic!("only {} of 100 records arrived in 20 s", seen.len()))
                .expect("consume");
            let value = String::from_utf8(msg.payload().unwrap().to_vec()).unwrap();
            assert!(seen.insert(value.clone()), "duplicate {value}");
        }
        assert_eq!(seen.len(), 100);
    }

    /// Partitions assigned to `c`, polling it once so that its rebalance
    /// callbacks run (assignment only progresses while a consumer is polled).
    fn assigned(c: &StreamConsumer) -> usize {
        let _ = futures::FutureExt::now_or_never(c.recv());
        c.assignment().map(|l| l.count()).unwrap_or(0)
    }

    /// Polls until `done(count_a, count_b)` or 15 s; returns the time taken.
    async fn wait_for(
        a: &StreamConsumer,
        b: Option<&StreamConsumer>,
        done: impl Fn(usize, usize) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let (na, nb) = (assigned(a), b.map_or(0, assigned));
            if done(na, nb) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "not settled after 15 s: {na} + {nb}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_consumers_split_the_partitions() {
        let topic = unique("split");
        let broker = DevBroker::start(&[(topic.clone(), 4)]).expect("mock starts");
        let group = unique("group");
        // A short session timeout: on the mock, a join into a group that
        // already has members waits session.timeout.ms - 1000.
        let make = || {
            ClientConfig::new()
                .set("bootstrap.servers", broker.bootstrap_servers())
                .set("group.id", &group)
                .set("session.timeout.ms", "2000")
                .set("heartbeat.interval.ms", "300")
                .create::<StreamConsumer>()
                .expect("consumer")
        };
        let a = make();
        a.subscribe(&[&topic]).unwrap();
        let first = wait_for(&a, None, |na, _| na == 4).await;
        let b = make();
        b.subscribe(&[&topic]).unwrap();
        let split = wait_for(&a, Some(&b), |na, nb| na + nb == 4 && na > 0 && nb > 0).await;
        eprintln!("first member assigned after {first:?}; second member split after {split:?}");
        // Bounds that tell the two behaviours apart with room for a loaded
        // machine, not how fast this one is: without the FFI call the first
        // join alone waits group.initial.rebalance.delay.ms (3 s), where it
        // otherwise takes milliseconds; the second join is held
        // session.timeout.ms − 1 s (1 s here), where librdkafka's default
        // session (45 s) would hold it 44 s.
        assert!(
            first < Duration::from_secs(2),
            "first assignment took {first:?}: initial rebalance delay not 0?"
        );
        assert!(
            split < Duration::from_secs(10),
            "split took {split:?} with session.timeout.ms=2000"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_are_visible_with_committed() {
        let topic = unique("commit");
        let broker = DevBroker::start(&[(topic.clone(), 1)]).expect("mock starts");
        let producer = producer(broker.bootstrap_servers());
        for i in 0..3 {
            let v = format!("{i}");
            producer
                .send(
                    FutureRecord::<(), _>::to(&topic).payload(&v),
                    Duration::from_secs(5),
                )
                .await
                .unwrap();
        }
        let group = unique("group");
        let c = consumer(broker.bootstrap_servers(), &group);
        c.subscribe(&[&topic]).unwrap();
        let first = tokio::time::timeout(Duration::from_secs(15), c.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.offset(), 0);
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Offset(2))
            .unwrap();
        c.commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .expect("sync commit");
        let committed = c.committed(Duration::from_secs(5)).expect("committed()");
        let got: HashMap<_, _> = committed
            .elements()
            .iter()
            .map(|e| ((e.topic().to_owned(), e.partition()), e.offset()))
            .collect();
        assert_eq!(
            got.get(&(topic.clone(), 0)),
            Some(&rdkafka::Offset::Offset(2)),
            "{got:?}"
        );
    }

    /// A writer the test can read while `serve_to` holds it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dev_broker_prints_bootstrap_first_and_serves_until_shutdown() {
        let out = Shared::default();
        let seen = out.clone();
        let topic = unique("dev");
        let topic2 = topic.clone();
        let shutdown = async move {
            // The first line is already there when serving starts.
            let text = String::from_utf8(seen.0.lock().unwrap().clone()).unwrap();
            let line = text.lines().next().expect("a first line");
            let servers = line
                .strip_prefix("bootstrap.servers=")
                .expect("bootstrap line first");
            producer(servers)
                .send(
                    FutureRecord::<(), _>::to(&topic2).payload("x"),
                    Duration::from_secs(5),
                )
                .await
                .expect("the dev broker accepts records while serving");
        };
        let mut writer = out.clone();
        tokio::time::timeout(
            Duration::from_secs(20),
            serve_to(&[(topic, 2)], shutdown, &mut writer),
        )
        .await
        .expect("serve returns once shutdown resolves")
        .expect("serve ok");
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text.lines().count(),
            1,
            "only the bootstrap line on stdout: {text:?}"
        );
    }
}
