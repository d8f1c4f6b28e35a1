//! Helpers for tests that run the binary: child processes that are killed
//! and reaped when the test ends (or fails), the `dev-broker` process,
//! worker processes with a config file, an in-test downstream that knows
//! which worker called, the workers' JSON logs, and the group's committed
//! offsets read without joining the group.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::worker::Arrival;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_throttle-worker");

/// How many log lines of a child to print when a test fails.
const TAIL_LINES: usize = 40;

/// A child process that is killed (SIGKILL) and reaped when dropped, so a
/// failing test leaves nothing running. Its stdout and stderr go to `log`
/// (the tail is printed only if the test panics, to keep output readable).
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    /// Set once the child was reaped (by `kill9` or `wait_exit`).
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `cmd` with stderr (and stdout, unless the caller piped it)
    /// appended to `dir/<name>.log`.
    pub fn spawn(name: &str, mut cmd: Command, dir: &Path, pipe_stdout: bool) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = File::create(&log).expect("child log file");
        let stdout = if pipe_stdout {
            Stdio::piped()
        } else {
            Stdio::from(file.try_clone().expect("clone log file"))
        };
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name: name.to_owned(),
            child,
            log,
            exited: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process' resident set in bytes (VmRSS, from /proc).
    pub fn rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("/proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    /// The child's stdout, if it was piped (taken once).
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// SIGKILL, then reap (a killed process exits at once, so `wait` cannot
    /// hang on it).
    pub fn kill9(&mut self) {
        if self.exited.is_some() {
            return;
        }
        let _ = self.child.kill();
        self.exited = self.child.wait().ok();
    }

    /// SIGTERM (through kill(1): no extra crate for one signal).
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// SIGINT: what Ctrl-C on a terminal sends.
    pub fn sigint(&self) {
        self.signal("INT");
    }

    /// SIGSTOP: the whole process stalls (its heartbeats too) until
    /// [`Proc::sigcont`].
    pub fn sigstop(&self) {
        self.signal("STOP");
    }

    pub fn sigcont(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits for the child to exit; panics after `timeout` saying what was
    /// awaited (the guard then kills it).
    pub async fn wait_exit(&mut self, what: &str, timeout: Duration) -> ExitStatus {
        if let Some(s) = self.exited {
            return s;
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(s);
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what} ({} pid {})",
                self.name,
                self.pid()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines that parse as JSON (the workers log with
    /// `THROTTLE_LOG_FORMAT=json`).
    pub fn log_events(&self) -> Vec<LogEvent> {
        self.log_text()
            .lines()
            .filter_map(LogEvent::parse)
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(TAIL_LINES);
            eprintln!(
                "---- last {} lines of {} ({}) ----",
                lines.len() - from,
                self.name,
                self.log.display()
            );
            for l in &lines[from..] {
                eprintln!("{l}");
            }
        }
    }
}

/// A scratch directory for config files and child logs. Removed at the end
/// unless `THROTTLE_TEST_KEEP_LOGS` is set, in which case its path is printed.
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Scratch {
    pub fn new(test: &str) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix(&format!("throttle-{test}-"))
            .tempdir()
            .expect("scratch dir");
        let path = dir.path().to_owned();
        if std::env::var_os("THROTTLE_TEST_KEEP_LOGS").is_some() {
            eprintln!("{test}: child logs kept in {}", path.display());
            let _ = dir.keep();
            return Scratch { dir: None, path };
        }
        Scratch {
            dir: Some(dir),
            path,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One line of a worker's JSON log.
#[derive(Debug, Clone)]
pub struct LogEvent {
    pub at: SystemTime,
    pub message: String,
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl LogEvent {
    fn parse(line: &str) -> Option<LogEvent> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let at = humantime::parse_rfc3339_weak(v.get("timestamp")?.as_str()?).ok()?;
        let fields = v.get("fields")?.as_object()?.clone();
        let message = fields.get("message")?.as_str()?.to_owned();
        Some(LogEvent {
            at,
            message,
            fields,
        })
    }

    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).and_then(|v| v.as_str())
    }
}

/// The partitions of `topic` a worker holds according to its log: its
/// "partitions assigned" and "partitions revoked" lines replayed in order
/// (each names the partitions that changed: under the default
/// cooperative-sticky assignor, only those that moved). `None` if it never
/// logged an assignment.
pub fn assignment_of(events: &[LogEvent], topic: &str) -> Option<Vec<i32>> {
    let mut held: Option<std::collections::BTreeSet<i32>> = None;
    for e in events {
        let parts = || partitions_in(e.field("partitions").unwrap_or(""), topic);
        match e.message.as_str() {
            "partitions assigned" => held.get_or_insert_with(Default::default).extend(parts()),
            "partitions revoked" => {
                if let Some(h) = held.as_mut() {
                    for p in parts() {
                        h.remove(&p);
                    }
                }
            }
            _ => {}
        }
    }
    held.map(|h| h.into_iter().collect())
}

/// The partitions of `topic` in a `topic[0],topic[3]` field.
pub fn partitions_in(field: &str, topic: &str) -> Vec<i32> {
    field
        .split(',')
        .filter_map(|tp| {
            let (t, rest) = tp.rsplit_once('[')?;
            (t == topic).then(|| rest.trim_end_matches(']').parse().ok())?
        })
        .collect()
}

/// Waits until the workers' logs show a settled group: every worker holds
/// at least one partition of `topic`, and together they hold each of its
/// `partitions` exactly once. Returns each worker's partitions.
pub async fn wait_settled(
    workers: &[&Proc],
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Vec<Vec<i32>> {
    let deadline = Instant::now() + timeout;
    loop {
        let held: Vec<Option<Vec<i32>>> = workers
            .iter()
            .map(|w| assignment_of(&w.log_events(), topic))
            .collect();
        if held
            .iter()
            .all(|h| h.as_ref().is_some_and(|p| !p.is_empty()))
        {
            let mut all: Vec<i32> = held.iter().flatten().flatten().copied().collect();
            all.sort_unstable();
            if all == (0..partitions).collect::<Vec<_>>() {
                return held.into_iter().flatten().collect();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {} workers to share the {partitions} partitions of {topic}; they hold {held:?}",
            workers.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `throttle-worker dev-broker --topic ...` as a child process, with the
/// bootstrap servers it printed.
pub struct BrokerProc {
    pub proc: Proc,
    pub bootstrap: String,
}

impl BrokerProc {
    pub fn start(dir: &Path, topics: &[(String, i32)]) -> BrokerProc {
        let mut cmd = Command::new(BIN);
        cmd.arg("dev-broker");
        for (t, n) in topics {
            cmd.arg("--topic").arg(format!("{t}:{n}"));
        }
        let mut proc = Proc::spawn("dev-broker", cmd, dir, true);
        let stdout = proc.take_stdout().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the first line, then keeps draining so the broker never
        // blocks on a full pipe; ends when the broker exits.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            for _ in lines {}
        });
        let wait = Duration::from_secs(20);
        let first = rx
            .recv_timeout(wait)
            .unwrap_or_else(|_| panic!("dev-broker printed no first line within {wait:?}"));
        let line = match first {
            Some(Ok(l)) => l,
            other => panic!("dev-broker's stdout ended or failed before a first line: {other:?}"),
        };
        let bootstrap = line
            .strip_prefix("bootstrap.servers=")
            .unwrap_or_else(|| {
                panic!("dev-broker's first line is not bootstrap.servers=…: {line:?}")
            })
            .to_owned();
        BrokerProc { proc, bootstrap }
    }
}

/// Names no other test or run uses: topics, group and key prefix of one
/// test's fleet.
pub struct Names {
    pub jobs: String,
    pub retry: String,
    pub dlq: String,
    pub group: String,
    pub prefix: String,
}

impl Names {
    pub fn new(test: &str) -> Names {
        let id = format!("{test}-{:08x}", rand::random::<u32>());
        Names {
            jobs: format!("jobs-{id}"),
            retry: format!("retry-{id}"),
            dlq: format!("dlq-{id}"),
            group: format!("group-{id}"),
            prefix: format!("ptest-{id}"),
        }
    }

    /// The topics to create: the jobs topic with `partitions`, the retry
    /// tiers and the dead-letter topic.
    pub fn topics(&self, partitions: i32) -> Vec<(String, i32)> {
        let topics = super::worker::Topics {
            jobs: self.jobs.clone(),
            retry: self.retry.clone(),
            dlq: self.dlq.clone(),
        };
        super::worker::topic_specs(&topics, partitions)
    }

    /// A worker config on these names; `rules` as [`WorkerConfig::rules`].
    pub fn config<'a>(
        &'a self,
        bootstrap: &'a str,
        rules: &'a str,
        shutdown_timeout: &'a str,
    ) -> WorkerConfig<'a> {
        WorkerConfig {
            bootstrap,
            group: &self.group,
            jobs_topic: &self.jobs,
            retry_topic: &self.retry,
            dlq_topic: &self.dlq,
            key_prefix: &self.prefix,
            rules,
            shutdown_timeout,
        }
    }
}

/// What a worker process's config file says.
pub struct WorkerConfig<'a> {
    pub bootstrap: &'a str,
    pub group: &'a str,
    pub jobs_topic: &'a str,
    pub retry_topic: &'a str,
    pub dlq_topic: &'a str,
    pub key_prefix: &'a str,
    /// TOML array of rules, e.g. `[{ algorithm = "gcra", limit = 10, period = "1s" }]`.
    pub rules: &'a str,
    pub shutdown_timeout: &'a str,
}

impl WorkerConfig<'_> {
    /// Writes the config to `dir/<name>.toml`. The downstream URL is set per
    /// worker through `THROTTLE__DOWNSTREAM__URL` (see [`start_worker`]).
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let text = format!(
            r#"[kafka]
brokers = "{bootstrap}"
group_id = "{group}"
topic = "{jobs}"
retry_topic_prefix = "{retry}"
dlq_topic = "{dlq}"
commit_interval = "200ms"

# The mock waits session.timeout.ms - 1 s on every rebalance, and notices a
# killed member only after session.timeout.ms.
[kafka.consumer_properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "300"

[redis]
url = "{redis}"
key_prefix = "{prefix}"
# A key prefix and a group of its own: a new install, run under the default
# on_state_loss = "wait" as a first deploy is.

[downstream]
timeout = "5s"
backoff_base = "50ms"
max_backoff = "400ms"

[http]
listen = "127.0.0.1:0"

[worker]
shutdown_timeout = "{shutdown}"

[limits]
default = {rules}
"#,
            bootstrap = self.bootstrap,
            group = self.group,
            jobs = self.jobs_topic,
            retry = self.retry_topic,
            dlq = self.dlq_topic,
            redis = super::redis_url(),
            prefix = self.key_prefix,
            shutdown = self.shutdown_timeout,
            rules = self.rules,
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).expect("write worker config");
        path
    }
}

/// `throttle-worker run --config FILE` with JSON logs at info level and
/// its own downstream URL.
pub fn start_worker(dir: &Path, name: &str, config: &Path, downstream_url: &str) -> Proc {
    start_worker_env(dir, name, config, downstream_url, &[])
}

/// [`start_worker`] with more environment (`THROTTLE__…` settings over the
/// config file's, e.g. the test's own Redis).
pub fn start_worker_env(
    dir: &Path,
    name: &str,
    config: &Path,
    downstream_url: &str,
    env: &[(&str, &str)],
) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .env("THROTTLE_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .env("THROTTLE__DOWNSTREAM__URL", downstream_url)
        .envs(env.iter().copied());
    Proc::spawn(name, cmd, dir, false)
}

/// An in-test downstream that records, with every arrival, which worker
/// sent it: each worker gets its own URL `/w/<tag>/registrations`.
/// Every call is answered 200 after `delay`; the arrival is recorded when
/// the request comes in.
pub struct TaggedDownstream {
    base: String,
    arrivals: Arc<Mutex<Vec<(String, Arrival)>>>,
    in_flight: Arc<Mutex<InFlight>>,
}

#[derive(Clone)]
struct TaggedState {
    arrivals: Arc<Mutex<Vec<(String, Arrival)>>>,
    delay: Duration,
    in_flight: Arc<Mutex<InFlight>>,
}

/// Calls under way at the downstream: per seller now and at most, and per
/// (worker tag, seller) now.
#[derive(Debug, Default)]
pub struct InFlight {
    pub now: HashMap<String, i64>,
    pub most: HashMap<String, i64>,
    pub by_worker: HashMap<(String, String), i64>,
}

/// One call under way; counted out when its answer leaves or its
/// connection drops (a killed worker).
struct Underway {
    in_flight: Arc<Mutex<InFlight>>,
    tag: String,
    seller: String,
}

impl Underway {
    fn start(in_flight: &Arc<Mutex<InFlight>>, tag: &str, seller: &str) -> Underway {
        let mut f = in_flight.lock().unwrap();
        let now = f.now.entry(seller.to_owned()).or_default();
        *now += 1;
        let n = *now;
        let most = f.most.entry(seller.to_owned()).or_default();
        *most = (*most).max(n);
        *f.by_worker
            .entry((tag.to_owned(), seller.to_owned()))
            .or_default() += 1;
        Underway {
            in_flight: in_flight.clone(),
            tag: tag.to_owned(),
            seller: seller.to_owned(),
        }
    }
}

impl Drop for Underway {
    fn drop(&mut self) {
        let mut f = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = f.now.get_mut(&self.seller) {
            *n -= 1;
        }
        if let Some(n) = f
            .by_worker
            .get_mut(&(self.tag.clone(), self.seller.clone()))
        {
            *n -= 1;
        }
    }
}

impl TaggedDownstream {
    pub async fn start(delay: Duration) -> TaggedDownstream {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let app = Router::new()
            .route("/w/{tag}/registrations", post(tagged_register))
            .with_state(TaggedState {
                arrivals: arrivals.clone(),
                delay,
                in_flight: in_flight.clone(),
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TaggedDownstream {
            base: format!("http://{addr}"),
            arrivals,
            in_flight,
        }
    }

    /// Calls of `seller` under way now, and the most at once so far.
    pub fn in_flight(&self, seller: &str) -> (i64, i64) {
        let f = self.in_flight.lock().unwrap();
        (
            f.now.get(seller).copied().unwrap_or(0),
            f.most.get(seller).copied().unwrap_or(0),
        )
    }

    /// Calls of `seller` under way now from the worker tagged `tag`.
    pub fn in_flight_from(&self, tag: &str, seller: &str) -> i64 {
        let f = self.in_flight.lock().unwrap();
        f.by_worker
            .get(&(tag.to_owned(), seller.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    pub fn url(&self, tag: &str) -> String {
        format!("{}/w/{tag}/registrations", self.base)
    }

    pub fn arrivals(&self) -> Vec<(String, Arrival)> {
        self.arrivals.lock().unwrap().clone()
    }

    /// Distinct job ids that arrived so far.
    pub fn distinct(&self) -> usize {
        let a = self.arrivals.lock().unwrap();
        a.iter()
            .map(|(_, x)| x.job_id.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// Waits until at least `n` distinct jobs arrived; panics after
    /// `timeout` with `what` and the count so far.
    pub async fn wait_distinct(&self, what: &str, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.distinct();
            if got >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}: {got} of {n} distinct jobs arrived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn tagged_register(
    State(s): State<TaggedState>,
    UrlPath(tag): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let arrival = Arrival {
        job_id: header("idempotency-key"),
        seller: header("x-seller-id"),
        cost: header("x-job-cost").parse().unwrap_or(1),
        worker: header("x-worker-id"),
        granted_at_us: header("x-granted-at").parse().ok(),
        traceparent: header("traceparent"),
        tracestate: header("tracestate"),
        via: String::new(),
        at: Instant::now(),
        wall: SystemTime::now(),
        body,
    };
    let underway = Underway::start(&s.in_flight, &tag, &arrival.seller);
    s.arrivals.lock().unwrap().push((tag, arrival));
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    drop(underway);
    StatusCode::OK
}

/// The group's committed offsets of `topic`'s partitions `0..partitions`
/// (`None`: nothing committed), read with a fresh consumer that never
/// joins the group (OffsetFetch only). Runs on a thread of its own with a
/// deadline, because creating and closing a consumer can hang.
pub async fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> BTreeMap<i32, Option<i64>> {
    let (bootstrap, group_id, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = (|| {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("group.id", &group_id)
                .set("enable.auto.commit", "false")
                .create()
                .map_err(|e| e.to_string())?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..partitions {
                tpl.add_partition(&topic, p);
            }
            let got = consumer
                .committed_offsets(tpl, timeout)
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(
                got.elements()
                    .iter()
                    .map(|e| {
                        let off = match e.offset() {
                            Offset::Offset(o) => Some(o),
                            _ => None,
                        };
                        (e.partition(), off)
                    })
                    .collect::<BTreeMap<_, _>>(),
            )
        })();
        let _ = tx.send(result);
    });
    let limit = timeout + Duration::from_secs(5);
    tokio::time::timeout(limit, rx)
        .await
        .unwrap_or_else(|_| {
            panic!("reading committed offsets of {group} did not return within {limit:?}")
        })
        .expect("the reader thread answers")
        .unwrap_or_else(|e| panic!("reading committed offsets of {group}: {e}"))
}

/// Polls the committed offsets until every partition's equals `end`
/// (offset past the last produced record); panics after `timeout` with the
/// last reading.
pub async fn wait_committed_to_end(
    bootstrap: &str,
    group: &str,
    topic: &str,
    end: &BTreeMap<i32, i64>,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let partitions = end.keys().max().map_or(0, |m| m + 1);
    loop {
        let got =
            committed_offsets(bootstrap, group, topic, partitions, Duration::from_secs(5)).await;
        let done = end
            .iter()
            .all(|(p, e)| got.get(p).copied().flatten() == Some(*e));
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {group} to commit to the end of {topic}: committed {got:?}, end {end:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The offset past the last produced record of each partition.
pub fn end_offsets(produced: &[(i32, i64)]) -> BTreeMap<i32, i64> {
    let mut end = BTreeMap::new();
    for &(p, o) in produced {
        let e = end.entry(p).or_insert(0);
        *e = (*e).max(o + 1);
    }
    end
}

/// Arrivals per job id, in arrival order: (worker tag, wall time).
pub fn by_job(arrivals: &[(String, Arrival)]) -> HashMap<String, Vec<(String, SystemTime)>> {
    let mut out: HashMap<String, Vec<(String, SystemTime)>> = HashMap::new();
    for (tag, a) in arrivals {
        out.entry(a.job_id.clone())
            .or_default()
            .push((tag.clone(), a.wall));
    }
    out
}
