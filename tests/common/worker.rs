//! A test bench for the worker: an embedded Kafka (librdkafka's mock
//! cluster), an in-test downstream that records every arrival with its time
//! and answers as the test says (with a hidden capacity and hidden
//! per-seller rate limits when told), worker instances in this process, and
//! helpers to produce jobs and read the dead-letter topic.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use throttle_worker::config::{self, RuleConfig, Settings};
use throttle_worker::kafka::DevBroker;
use throttle_worker::limiter::Policy;
use throttle_worker::worker::{self, Summary};

/// One call that reached the downstream.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub job_id: String,
    pub seller: String,
    /// `X-Job-Cost`: the units the job weighs (1 when absent).
    pub cost: u64,
    /// `X-Worker-Id`: the replica that called.
    pub worker: String,
    /// `X-Granted-At`: when the limiter granted the job (Unix µs on Redis'
    /// clock; a pacer's go-at), if a Redis decided.
    pub granted_at_us: Option<u64>,
    /// `traceparent` and `tracestate` (W3C trace context), `""` if absent.
    pub traceparent: String,
    pub tracestate: String,
    /// The query string of the URL called (`""` if none): a test that
    /// gives each worker `{url}?w=NAME` knows which worker called.
    pub via: String,
    pub at: Instant,
    pub wall: SystemTime,
    pub body: Bytes,
}

/// What the downstream answers, decided per arrival (with the count of
/// earlier arrivals of the same job).
pub type Behaviour = Arc<dyn Fn(&Arrival, usize) -> (StatusCode, Option<String>) + Send + Sync>;

pub fn always_ok() -> Behaviour {
    Arc::new(|_, _| (StatusCode::OK, None))
}

#[derive(Clone)]
struct DownstreamState {
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    /// Arrivals so far per job id (a scan of `arrivals` per request made
    /// the stub, not the worker, the bottleneck of large runs).
    seen: Arc<Mutex<HashMap<String, usize>>>,
    behaviour: Behaviour,
    /// How long each answer takes, in ms (a slow downstream).
    delay_ms: Arc<AtomicU64>,
    shedding: Arc<Shedding>,
    rates: Arc<SellerRates>,
}

/// A hidden capacity: beyond `capacity` calls under way (0: none), a call
/// is answered 503 at once, and not recorded as an arrival.
#[derive(Default)]
struct Shedding {
    capacity: AtomicU64,
    busy: AtomicU64,
    shed: AtomicU64,
}

/// Hidden per-seller rate limits, as a real API keeps them: a fixed window
/// per seller aligned on whole seconds of Unix time (the common
/// `INCR seller:second` counter), every call counted, answered or not.
/// Beyond `per_second` calls in the current second a call is answered 429
/// at once with `Retry-After: 1` (the time left in the window, rounded up
/// to whole seconds as the header requires: always 1 for a 1-second
/// window, so a client that obeys it waits up to a second longer than it
/// had to), and is not recorded as an arrival: `arrivals` holds the calls
/// served, `throttled` the ones refused.
#[derive(Default)]
struct SellerRates(Mutex<HashMap<String, SellerWindow>>);

/// One seller's limit and the counter of its current window.
struct SellerWindow {
    per_second: u64,
    /// The Unix second the counter is for.
    second: u64,
    /// Calls of the seller in `second`, served and refused.
    calls: u64,
    /// When each call answered 429 arrived, in order.
    throttled: Vec<Instant>,
}

impl SellerRates {
    /// Counts a call of `seller` at `wall`; whether it is beyond the
    /// seller's limit (then recorded as throttled at `at`).
    fn over(&self, seller: &str, wall: SystemTime, at: Instant) -> bool {
        let mut rates = self.0.lock().unwrap();
        let Some(w) = rates.get_mut(seller) else {
            return false;
        };
        let second = wall
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_secs();
        if second != w.second {
            w.second = second;
            w.calls = 0;
        }
        w.calls += 1;
        if w.calls <= w.per_second {
            return false;
        }
        w.throttled.push(at);
        true
    }
}

/// A call under way at the downstream, until its answer is sent.
struct Busy<'a>(&'a AtomicU64);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The in-test downstream API.
pub struct Downstream {
    pub url: String,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    delay_ms: Arc<AtomicU64>,
    shedding: Arc<Shedding>,
    rates: Arc<SellerRates>,
}

impl Downstream {
    pub async fn start(behaviour: Behaviour) -> Downstream {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let shedding = Arc::new(Shedding::default());
        let rates = Arc::new(SellerRates::default());
        let state = DownstreamState {
            arrivals: arrivals.clone(),
            seen: Arc::default(),
            behaviour,
            delay_ms: delay_ms.clone(),
            shedding: shedding.clone(),
            rates: rates.clone(),
        };
        let app = Router::new()
            .route("/registrations", post(register))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Downstream {
            url: format!("http://{addr}/registrations"),
            arrivals,
            delay_ms,
            shedding,
            rates,
        }
    }

    /// Gives `seller` a hidden rate limit of `per_second` calls in each
    /// second of Unix time, beyond which its calls are answered 429 with
    /// `Retry-After: 1` and not recorded as arrivals (see [`SellerRates`]).
    pub fn set_seller_rate(&self, seller: &str, per_second: u64) {
        self.rates.0.lock().unwrap().insert(
            seller.to_owned(),
            SellerWindow {
                per_second,
                second: 0,
                calls: 0,
                throttled: Vec::new(),
            },
        );
    }

    /// When each call of `seller` answered 429 for its rate limit arrived
    /// (empty for a seller without one).
    pub fn throttled(&self, seller: &str) -> Vec<Instant> {
        self.rates
            .0
            .lock()
            .unwrap()
            .get(seller)
            .map(|w| w.throttled.clone())
            .unwrap_or_default()
    }

    /// The calls of `seller` served (recorded as arrivals), in order.
    pub fn served(&self, seller: &str) -> Vec<Arrival> {
        self.arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.seller == seller)
            .cloned()
            .collect()
    }

    /// Sheds (503 at once, no arrival recorded) every call beyond
    /// `calls` under way: a capacity the worker is not told.
    pub fn set_capacity(&self, calls: u64) {
        self.shedding.capacity.store(calls, Ordering::SeqCst);
    }

    /// Calls shed so far.
    pub fn shed(&self) -> u64 {
        self.shedding.shed.load(Ordering::SeqCst)
    }

    /// Makes every later answer take `delay` (after the arrival is recorded).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }

    /// Arrivals answered 2xx, by job id (the last one).
    pub fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }

    /// Waits until `n` distinct jobs have arrived, or panics after
    /// `timeout` with `what`.
    pub async fn wait_distinct(&self, what: &str, n: usize, timeout: Duration) {
        self.wait_for(what, timeout, |a| {
            a.iter()
                .map(|x| x.job_id.as_str())
                .collect::<std::collections::HashSet<_>>()
                .len()
                >= n
        })
        .await;
    }

    /// Waits until `pred` holds over the arrivals, or panics after `timeout`
    /// with `what` and the count so far.
    pub async fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&[Arrival]) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let a = self.arrivals.lock().unwrap();
                if pred(&a) {
                    return;
                }
                if Instant::now() > deadline {
                    panic!(
                        "timed out after {timeout:?} waiting for {what}; {} arrivals so far",
                        a.len()
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn register(
    State(s): State<DownstreamState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let sh = &s.shedding;
    let busy = Busy(&sh.busy);
    let now_busy = busy.0.fetch_add(1, Ordering::SeqCst) + 1;
    let capacity = sh.capacity.load(Ordering::SeqCst);
    if capacity > 0 && now_busy > capacity {
        sh.shed.fetch_add(1, Ordering::SeqCst);
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (at, wall) = (Instant::now(), SystemTime::now());
    if s.rates.over(&header("x-seller-id"), wall, at) {
        let mut resp = StatusCode::TOO_MANY_REQUESTS.into_response();
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        return resp;
    }
    let arrival = Arrival {
        job_id: header("idempotency-key"),
        seller: header("x-seller-id"),
        cost: header("x-job-cost").parse().unwrap_or(1),
        worker: header("x-worker-id"),
        granted_at_us: header("x-granted-at").parse().ok(),
        traceparent: header("traceparent"),
        tracestate: header("tracestate"),
        via: uri.query().unwrap_or("").to_owned(),
        at,
        wall,
        body,
    };
    let earlier = {
        let mut a = s.arrivals.lock().unwrap();
        let mut seen = s.seen.lock().unwrap();
        let n = seen.entry(arrival.job_id.clone()).or_insert(0);
        let earlier = *n;
        *n += 1;
        a.push(arrival.clone());
        earlier
    };
    let (status, retry_after) = (s.behaviour)(&arrival, earlier);
    let delay = s.delay_ms.load(Ordering::Relaxed);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let mut resp = status.into_response();
    if let Some(ra) = retry_after {
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from_str(&ra).unwrap());
    }
    resp
}

/// The seller of [`wait_all_calling`]'s probe jobs.
pub const PROBE_SELLER: &str = "probe";

/// Waits until `replicas` distinct workers (by `X-Worker-Id`) have called
/// the downstream, producing probe jobs (seller [`PROBE_SELLER`], keyed at
/// random so they land on every partition) until each has called one.
/// Every replica then holds partitions in the group's latest generation (a
/// member is given partitions only once every member that joined before it
/// is in), so no rebalance follows unless a member leaves or misses its
/// session: the group has settled, observed rather than slept on. Panics
/// after `timeout`; returns the probes produced.
pub async fn wait_all_calling(
    bench: &Bench,
    down: &Downstream,
    replicas: usize,
    timeout: Duration,
) -> usize {
    let deadline = Instant::now() + timeout;
    let mut probes = 0;
    loop {
        let callers: std::collections::HashSet<String> = down
            .arrivals()
            .into_iter()
            .filter(|a| a.seller == PROBE_SELLER)
            .map(|a| a.worker)
            .collect();
        if callers.len() >= replicas {
            return probes;
        }
        assert!(
            Instant::now() < deadline,
            "{replicas} replicas never all called within {timeout:?}: {callers:?} after {probes} probes"
        );
        let batch: Vec<_> = (probes..probes + 2 * replicas)
            .map(|i| job(&format!("probe-{i}"), PROBE_SELLER))
            .collect();
        probes += batch.len();
        bench.produce(&batch).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Topic names unique to one test.
#[derive(Debug, Clone)]
pub struct Topics {
    pub jobs: String,
    pub retry: String,
    pub dlq: String,
}

/// An embedded broker with the three topics of one test.
pub struct Bench {
    pub broker: DevBroker,
    pub topics: Topics,
    pub group: String,
    pub prefix: String,
}

impl Bench {
    pub fn new(name: &str, partitions: i32) -> Bench {
        let id = format!("{name}-{:08x}", rand::random::<u32>());
        let topics = Topics {
            jobs: format!("jobs-{id}"),
            retry: format!("retry-{id}"),
            dlq: format!("dlq-{id}"),
        };
        let broker = DevBroker::start(&topic_specs(&topics, partitions)).expect("mock cluster");
        Bench {
            broker,
            topics,
            group: format!("group-{id}"),
            prefix: format!("wtest-{id}"),
        }
    }

    /// The topic of the default retry tier whose delay is `delay`.
    pub fn retry_tier(&self, delay: &str) -> String {
        format!("{}.{delay}", self.topics.retry)
    }

    pub fn bootstrap(&self) -> String {
        self.broker.bootstrap_servers().to_owned()
    }

    /// Default settings pointed at this bench, with `rules` as every
    /// seller's limits and fast group membership for the mock.
    pub fn settings(&self, downstream_url: &str) -> Settings {
        let mut s = config::load_from(None, Vec::new())
            .expect("defaults")
            .settings;
        s.kafka.brokers = self.bootstrap();
        s.kafka.group_id = self.group.clone();
        s.kafka.topic = self.topics.jobs.clone();
        s.kafka.retry_topic_prefix = self.topics.retry.clone();
        s.kafka.dlq_topic = self.topics.dlq.clone();
        s.kafka.commit_interval = Duration::from_millis(200);
        // The mock waits session.timeout.ms − 1 s on every rebalance.
        for (k, v) in [
            ("session.timeout.ms", "3000"),
            ("heartbeat.interval.ms", "300"),
        ] {
            s.kafka
                .consumer_properties
                .insert(k.to_owned(), v.to_owned());
        }
        s.redis.url = super::redis_url();
        s.redis.key_prefix = self.prefix.clone();
        // A key prefix and a group of its own: a new install, which runs
        // under the default `redis.on_state_loss = "wait"` as a first
        // deploy does (a group that never committed is not a loss).
        s.downstream.url = downstream_url.to_owned();
        s.downstream.timeout = Duration::from_secs(5);
        s.downstream.backoff_base = Duration::from_millis(50);
        s.downstream.max_backoff = Duration::from_millis(400);
        s.http.listen = "127.0.0.1:0".parse().unwrap();
        s.worker.shutdown_timeout = Duration::from_secs(5);
        s
    }

    pub async fn produce(&self, records: &[(Option<String>, Vec<u8>)]) -> Vec<(i32, i64)> {
        produce(&self.bootstrap(), &self.topics.jobs, records).await
    }

    /// Waits until the group has committed the jobs topic to the end of
    /// `produced` (see [`super::procs::wait_committed_to_end`]).
    pub async fn wait_committed(&self, produced: &[(i32, i64)], timeout: Duration) {
        super::procs::wait_committed_to_end(
            &self.bootstrap(),
            &self.group,
            &self.topics.jobs,
            &super::procs::end_offsets(produced),
            timeout,
        )
        .await;
    }

    /// Waits up to `timeout` until the dead-letter topic holds at least
    /// `expect` records. A test that asserts "dead-lettered once" waits
    /// with this, stops its worker, then reads with [`Self::dead_letters`]:
    /// a duplicate written before the worker was gone is then seen too.
    pub fn wait_dead_letters(&self, expect: usize, timeout: Duration) {
        let _ = self.dead_letters(expect, timeout);
    }

    /// Every record on the dead-letter topic: value and headers. Waits up
    /// to `timeout` for at least `expect` to be there, then reads the topic
    /// to its end (its high watermarks at that moment), so that a caller
    /// asserting "dead-lettered once" sees any duplicate too.
    pub fn dead_letters(
        &self,
        expect: usize,
        timeout: Duration,
    ) -> Vec<(Vec<u8>, HashMap<String, String>)> {
        read_to_end(&self.bootstrap(), &self.topics.dlq, expect, timeout)
    }
}

/// Every record of `topic`: value and headers. Waits up to `timeout` for
/// at least `expect` records to be there, then reads the topic to its end
/// (its high watermarks at that moment), so that a caller asserting "once"
/// sees any duplicate too.
pub fn read_to_end(
    bootstrap: &str,
    topic: &str,
    expect: usize,
    timeout: Duration,
) -> Vec<(Vec<u8>, HashMap<String, String>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{:x}", rand::random::<u64>()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let ends = || -> HashMap<i32, i64> {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .unwrap();
        md.topics()
            .iter()
            .flat_map(|t| t.partitions())
            .map(|p| {
                let (_, high) = consumer
                    .fetch_watermarks(topic, p.id(), Duration::from_secs(5))
                    .unwrap();
                (p.id(), high)
            })
            .collect()
    };
    let deadline = Instant::now() + timeout;
    let mut end = ends();
    while (end.values().sum::<i64>() as usize) < expect && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        end = ends();
    }
    consumer.subscribe(&[topic]).unwrap();
    let mut read_to: HashMap<i32, i64> = HashMap::new();
    let mut out = Vec::new();
    let read_all = |read_to: &HashMap<i32, i64>| {
        end.iter()
            .all(|(p, high)| read_to.get(p).copied().unwrap_or(0) >= *high)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !read_all(&read_to) {
        assert!(
            Instant::now() < deadline,
            "{topic} was not read to its end ({end:?}) within 20 s"
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if m.offset() >= end.get(&m.partition()).copied().unwrap_or(0) {
                continue;
            }
            read_to.insert(m.partition(), m.offset() + 1);
            let mut headers = HashMap::new();
            if let Some(h) = m.headers() {
                for hd in h.iter() {
                    headers.insert(
                        hd.key.to_owned(),
                        String::from_utf8_lossy(hd.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            out.push((m.payload().unwrap_or_default().to_vec(), headers));
        }
    }
    out
}

/// Every topic a worker with the default retry tiers needs, with
/// `partitions` partitions (the dead-letter topic one).
pub fn topic_specs(topics: &Topics, partitions: i32) -> Vec<(String, i32)> {
    let mut kafka = config::load_from(None, Vec::new())
        .expect("defaults")
        .settings
        .kafka;
    kafka.topic = topics.jobs.clone();
    kafka.retry_topic_prefix = topics.retry.clone();
    kafka.dlq_topic = topics.dlq.clone();
    kafka.topic_specs(partitions)
}

/// Produces `records` (key, value) and returns each one's (partition, offset).
pub async fn produce(
    bootstrap: &str,
    topic: &str,
    records: &[(Option<String>, Vec<u8>)],
) -> Vec<(i32, i64)> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let sends = records.iter().map(|(key, value)| {
        let producer = &producer;
        async move {
            let mut rec = FutureRecord::to(topic).payload(value.as_slice());
            if let Some(k) = key {
                rec = rec.key(k.as_str());
            }
            producer
                .send(rec, Duration::from_secs(10))
                .await
                .expect("produce")
        }
    });
    futures::future::join_all(sends)
        .await
        .into_iter()
        .map(|d| (d.partition, d.offset))
        .collect()
}

/// Produces one record with headers to `topic`'s `partition`.
pub async fn produce_with_headers(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    value: &[u8],
    headers: &[(&str, String)],
) -> i64 {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let mut owned = rdkafka::message::OwnedHeaders::new();
    for (k, v) in headers {
        owned = owned.insert(rdkafka::message::Header {
            key: k,
            value: Some(v.as_str()),
        });
    }
    let rec = FutureRecord::<(), [u8]>::to(topic)
        .partition(partition)
        .payload(value)
        .headers(owned);
    producer
        .send(rec, Duration::from_secs(10))
        .await
        .expect("produce")
        .offset
}

/// A job record of `cost` units, keyed like [`job`].
pub fn job_of_cost(job_id: &str, seller: &str, cost: u64) -> (Option<String>, Vec<u8>) {
    let value = serde_json::json!({
        "job_id": job_id,
        "seller_id": seller,
        "cost": cost,
        "payload": { "sku": job_id, "title": "a bulk upload" }
    });
    (
        Some(format!("product-{}", rand::random::<u32>())),
        value.to_string().into_bytes(),
    )
}

/// A job record: JSON envelope, keyed by a random product so that one
/// seller's jobs spread over partitions.
pub fn job(job_id: &str, seller: &str) -> (Option<String>, Vec<u8>) {
    let value = serde_json::json!({
        "job_id": job_id,
        "seller_id": seller,
        "payload": { "sku": job_id, "title": "a product" }
    });
    (
        Some(format!("product-{}", rand::random::<u32>())),
        value.to_string().into_bytes(),
    )
}

/// A job record like [`job`] whose `"priority"` member is `priority`, any
/// JSON (a level from 0 to 9, or an invalid one such as `"high"` or 12).
pub fn job_of_priority(
    job_id: &str,
    seller: &str,
    priority: serde_json::Value,
) -> (Option<String>, Vec<u8>) {
    let value = serde_json::json!({
        "job_id": job_id,
        "seller_id": seller,
        "priority": priority,
        "payload": { "sku": job_id, "title": "a product" }
    });
    (
        Some(format!("product-{}", rand::random::<u32>())),
        value.to_string().into_bytes(),
    )
}

pub fn policy(rules: Vec<RuleConfig>) -> Policy {
    super::policy(rules, vec![])
}

/// A policy of `rules` for every seller but [`PROBE_SELLER`], which is
/// unlimited. Under a rule of an hour the probes of [`wait_all_calling`]
/// share the probe seller's hour: a slow rebalance spends it before every
/// replica has called (60 an hour, seen in CI: 2 of 3 replicas after 1188
/// probes), and the wait fails on the harness, not the subject.
pub fn policy_with_free_probes(rules: Vec<RuleConfig>) -> Policy {
    let probe = throttle_worker::config::SellerConfig {
        unlimited: true,
        ..Default::default()
    };
    super::policy_with_sellers(rules, vec![(PROBE_SELLER, probe)])
}

/// A worker running in this process.
pub struct Running {
    pub handle: JoinHandle<Result<Summary, throttle_worker::worker::StartError>>,
    stop: Option<oneshot::Sender<()>>,
}

impl Running {
    pub fn start(settings: Settings, policy: Policy) -> Running {
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(worker::run(settings, policy, async move {
            let _ = rx.await;
        }));
        Running {
            handle,
            stop: Some(tx),
        }
    }

    /// A worker whose engine logs to `subscriber` alone, not to the
    /// process' subscriber: a test reads its own worker's events, whatever
    /// else runs in the process. (Tasks the worker spawns log to the
    /// process' subscriber; the engine's loop, where the decisions are
    /// logged, runs in this future.)
    pub fn start_with_subscriber(
        settings: Settings,
        policy: Policy,
        subscriber: tracing::Dispatch,
    ) -> Running {
        use tracing::instrument::WithSubscriber;
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(
            worker::run(settings, policy, async move {
                let _ = rx.await;
            })
            .with_subscriber(subscriber),
        );
        Running {
            handle,
            stop: Some(tx),
        }
    }

    /// Graceful shutdown; returns the worker's summary.
    pub async fn stop(mut self) -> Summary {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("worker stops within 30s")
            .expect("worker task")
            .expect("worker result")
    }
}

/// p-th percentile (0..=100) of `xs` (sorted here).
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if xs.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (xs.len() - 1) as f64).round() as usize;
    xs[i]
}
