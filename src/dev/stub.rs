//! `throttle-worker stub`: a downstream product-registration API that
//! counts, for the demo (in process) and for docker-compose (as a service).
//!
//! `POST /registrations` takes a job the way the worker sends it (see
//! [`crate::downstream`]: `Idempotency-Key` is the job id, `X-Seller-Id`
//! the seller), remembers the arrival (seller, job id, when) and answers
//! 200. `--throttle SELLER=N/PERIOD` makes the stub enforce a limit of its
//! own on that seller, in fixed windows of PERIOD from the stub's start:
//! past N calls in a window it answers 429 with a `Retry-After` (whole
//! seconds to the window's end, at least 1), so the worker's 429 path can
//! be seen. `--latency` delays every answer.
//!
//! `GET /stats` returns, per seller, the calls, the accepted and throttled
//! ones, and every call's arrival in µs since the stub started (enough to
//! find the busiest window); `GET /jobs`, per job id, its calls and
//! acceptances.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

/// The path the worker posts jobs to (the default `downstream.url`'s).
pub const PATH: &str = "/registrations";

/// `--throttle SELLER=N/PERIOD`: at most `limit` accepted calls of `seller`
/// per fixed window of `period`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttle {
    pub seller: String,
    pub limit: u64,
    pub period: Duration,
}

/// Why a `--throttle` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThrottleError {
    #[error("--throttle {0:?}: expected SELLER=N/PERIOD, e.g. seller-3=40/10s")]
    Shape(String),
    #[error("--throttle {0:?}: the seller is empty")]
    EmptySeller(String),
    #[error("--throttle {spec:?}: N {n:?} is not a whole number of at least 1")]
    BadLimit { spec: String, n: String },
    #[error("--throttle {spec:?}: PERIOD {period:?} is not a duration of at least 1ms (write e.g. 1s, 10s, 1m)")]
    BadPeriod { spec: String, period: String },
}

impl FromStr for Throttle {
    type Err = ThrottleError;

    fn from_str(spec: &str) -> Result<Throttle, ThrottleError> {
        let (seller, rate) = spec
            .rsplit_once('=')
            .ok_or_else(|| ThrottleError::Shape(spec.to_owned()))?;
        let (n, period) = rate
            .split_once('/')
            .ok_or_else(|| ThrottleError::Shape(spec.to_owned()))?;
        if seller.trim().is_empty() {
            return Err(ThrottleError::EmptySeller(spec.to_owned()));
        }
        let limit = n
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| ThrottleError::BadLimit {
                spec: spec.to_owned(),
                n: n.to_owned(),
            })?;
        let period = humantime::parse_duration(period.trim())
            .ok()
            .filter(|p| *p >= Duration::from_millis(1))
            .ok_or_else(|| ThrottleError::BadPeriod {
                spec: spec.to_owned(),
                period: period.to_owned(),
            })?;
        Ok(Throttle {
            seller: seller.trim().to_owned(),
            limit,
            period,
        })
    }
}

impl std::fmt::Display for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={}/{}",
            self.seller,
            self.limit,
            humantime::format_duration(self.period)
        )
    }
}

/// `throttle-worker stub`.
#[derive(Debug, Clone, clap::Args)]
pub struct StubArgs {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// SELLER=N/PERIOD: answer 429 with Retry-After past N calls of SELLER
    /// per PERIOD (fixed windows from the start). Repeatable.
    #[arg(long = "throttle", value_parser = parse_throttle)]
    pub throttle: Vec<Throttle>,
    /// Delay every answer by this much, e.g. 20ms.
    #[arg(long, value_parser = parse_latency, default_value = "0s")]
    pub latency: Duration,
    /// SELLER: answer every call of SELLER with 500, as a downstream
    /// failing that seller's registrations (its jobs end in the
    /// dead-letter topic as attempts_exhausted). Repeatable.
    #[arg(long = "fail")]
    pub fail: Vec<String>,
}

fn parse_throttle(spec: &str) -> Result<Throttle, String> {
    spec.parse().map_err(|e: ThrottleError| e.to_string())
}

fn parse_latency(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("--latency {s:?}: {e} (write e.g. 0s, 20ms)"))
}

/// Deliberate miscounting, for proving that the demo's checks can fail
/// (hidden demo flags; never set by `throttle-worker stub`).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Every call of these sellers is recorded twice (as if the limiter
    /// had let twice the calls through).
    pub double_count: HashSet<String>,
    /// Calls of these sellers are answered 200 but not recorded (as if the
    /// jobs had been lost on the way).
    pub forget: HashSet<String>,
}

/// How a [`Stub`] answers.
#[derive(Debug, Clone, Default)]
pub struct StubConfig {
    pub throttle: Vec<Throttle>,
    pub latency: Duration,
    pub faults: Faults,
    /// Sellers whose every call is answered 500.
    pub fail: HashSet<String>,
}

/// What the stub has seen of one seller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SellerStats {
    /// Calls received (accepted + throttled).
    pub calls: u64,
    /// Calls answered 200.
    pub accepted: u64,
    /// Calls answered 429.
    pub throttled: u64,
    /// Calls answered 500 (`--fail`), not counted in `calls`.
    #[serde(default)]
    pub failed: u64,
    /// Each call's arrival, µs since the stub started, in arrival order.
    pub arrivals_us: Vec<u64>,
}

/// `GET /stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// µs since the stub started, when these stats were taken.
    pub uptime_us: u64,
    pub sellers: BTreeMap<String, SellerStats>,
}

/// What the stub has seen of one job id (`GET /jobs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStats {
    pub calls: u32,
    pub accepted: u32,
}

/// A fixed window of a throttled seller: its index since the start and the
/// calls it accepted.
#[derive(Debug, Default)]
struct Window {
    index: u64,
    accepted: u64,
}

#[derive(Debug)]
struct Book {
    sellers: HashMap<String, SellerStats>,
    jobs: HashMap<String, JobStats>,
    windows: HashMap<String, Window>,
}

#[derive(Debug)]
struct Shared {
    started: Instant,
    throttle: HashMap<String, Throttle>,
    latency: Duration,
    faults: Faults,
    fail: HashSet<String>,
    book: Mutex<Book>,
}

impl Shared {
    fn new(config: StubConfig) -> Shared {
        Shared {
            started: Instant::now(),
            throttle: config
                .throttle
                .into_iter()
                .map(|t| (t.seller.clone(), t))
                .collect(),
            latency: config.latency,
            faults: config.faults,
            fail: config.fail,
            book: Mutex::new(Book {
                sellers: HashMap::new(),
                jobs: HashMap::new(),
                windows: HashMap::new(),
            }),
        }
    }
}

/// A running stub; serves until dropped.
#[derive(Debug)]
pub struct Stub {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Why the stub could not start.
#[derive(Debug, thiserror::Error)]
#[error("the stub cannot listen on {addr}: {source}")]
pub struct StubError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

impl Stub {
    /// Binds `addr` and serves in the background.
    pub async fn start(addr: SocketAddr, config: StubConfig) -> Result<Stub, StubError> {
        let fail = |source| StubError { addr, source };
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(fail)?;
        let bound = listener.local_addr().map_err(fail)?;
        let shared = Arc::new(Shared::new(config));
        let app = Router::new()
            .route(PATH, post(register))
            .route("/stats", get(stats))
            .route("/jobs", get(jobs))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "stub server stopped");
            }
        });
        Ok(Stub {
            addr: bound,
            shared,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to give the worker as `downstream.url`.
    pub fn url(&self) -> String {
        format!("http://{}{PATH}", self.addr)
    }

    /// When the stub started: arrivals are counted from here.
    pub fn started(&self) -> Instant {
        self.shared.started
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Every job id seen, with its calls and acceptances.
    pub fn jobs(&self) -> HashMap<String, JobStats> {
        self.shared.lock().jobs.clone()
    }

    /// Calls per seller in the last `span` (for a live rate), without
    /// copying every arrival.
    pub fn recent_calls(&self, span: Duration) -> BTreeMap<String, u64> {
        let now = self.shared.started.elapsed().as_micros() as u64;
        let from = now.saturating_sub(span.as_micros() as u64);
        let book = self.shared.lock();
        book.sellers
            .iter()
            .map(|(seller, s)| {
                let i = s.arrivals_us.partition_point(|t| *t < from);
                (seller.clone(), (s.arrivals_us.len() - i) as u64)
            })
            .collect()
    }

    /// Per seller: (calls, accepted, throttled), without the arrivals.
    pub fn counts(&self) -> BTreeMap<String, (u64, u64, u64)> {
        self.shared
            .lock()
            .sellers
            .iter()
            .map(|(k, s)| (k.clone(), (s.calls, s.accepted, s.throttled)))
            .collect()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A panic while holding the lock leaves plain counters behind,
        // still worth reading.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stats(&self) -> Stats {
        let uptime_us = self.started.elapsed().as_micros() as u64;
        let book = self.lock();
        Stats {
            uptime_us,
            sellers: book
                .sellers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// Records one call and decides its answer: `None` for 200, or the
    /// Retry-After in whole seconds for a 429.
    fn record(&self, seller: &str, job_id: &str) -> Option<u64> {
        if self.faults.forget.contains(seller) {
            return None;
        }
        let mut book = self.lock();
        // Read under the lock, so that every seller's arrivals are in order.
        let at_us = self.started.elapsed().as_micros() as u64;
        let retry_after = self.throttle.get(seller).and_then(|t| {
            let period_us = t.period.as_micros().max(1) as u64;
            let index = at_us / period_us;
            let w = book.windows.entry(seller.to_owned()).or_default();
            if w.index != index {
                *w = Window { index, accepted: 0 };
            }
            if w.accepted < t.limit {
                w.accepted += 1;
                None
            } else {
                let end_us = (index + 1) * period_us;
                Some((end_us - at_us).div_ceil(1_000_000).max(1))
            }
        });
        let times = if self.faults.double_count.contains(seller) {
            2
        } else {
            1
        };
        for _ in 0..times {
            let s = book.sellers.entry(seller.to_owned()).or_default();
            s.calls += 1;
            s.arrivals_us.push(at_us);
            match retry_after {
                None => s.accepted += 1,
                Some(_) => s.throttled += 1,
            }
            let j = book.jobs.entry(job_id.to_owned()).or_default();
            j.calls += 1;
            if retry_after.is_none() {
                j.accepted += 1;
            }
        }
        retry_after
    }
}

async fn register(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let (Some(seller), Some(job_id)) = (header("x-seller-id"), header("idempotency-key")) else {
        return (
            StatusCode::BAD_REQUEST,
            "the stub needs X-Seller-Id and Idempotency-Key (the job id) on every call\n",
        )
            .into_response();
    };
    if s.fail.contains(seller) {
        s.lock()
            .sellers
            .entry(seller.to_owned())
            .or_default()
            .failed += 1;
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the stub fails this seller (--fail)\n",
        )
            .into_response();
    }
    let retry_after = s.record(seller, job_id);
    if !s.latency.is_zero() {
        tokio::time::sleep(s.latency).await;
    }
    match retry_after {
        None => (StatusCode::OK, "accepted\n").into_response(),
        Some(secs) => {
            let limit = s.throttle.get(seller).map(ToString::to_string);
            let mut resp = (
                StatusCode::TOO_MANY_REQUESTS,
                format!("over the stub's limit {}\n", limit.unwrap_or_default()),
            )
                .into_response();
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
            resp
        }
    }
}

async fn stats(State(s): State<Arc<Shared>>) -> Json<Stats> {
    Json(s.stats())
}

async fn jobs(State(s): State<Arc<Shared>>) -> Json<BTreeMap<String, JobStats>> {
    Json(s.lock().jobs.iter().map(|(k, v)| (k.clone(), *v)).collect())
}

/// `throttle-worker stub`: serves until `shutdown` resolves. The first
/// stdout line names the URL to give the worker as `downstream.url`.
/// Fails only if it cannot listen.
pub async fn serve(args: StubArgs, shutdown: impl Future<Output = ()>) -> Result<(), StubError> {
    let throttles: Vec<String> = args.throttle.iter().map(ToString::to_string).collect();
    let stub = Stub::start(
        args.listen,
        StubConfig {
            throttle: args.throttle,
            latency: args.latency,
            faults: Faults::default(),
            fail: args.fail.into_iter().collect(),
        },
    )
    .await?;
    println!("downstream.url=http://{}{PATH}", stub.addr());
    tracing::info!(
        listen = %stub.addr(),
        throttle = ?throttles,
        latency = ?args.latency,
        "stub serving"
    );
    shutdown.await;
    let stats = stub.stats();
    let calls: u64 = stats.sellers.values().map(|s| s.calls).sum();
    tracing::info!(calls, sellers = stats.sellers.len(), "stub stopping");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_specs() {
        let ok = |s: &str, seller: &str, limit: u64, period_ms: u64| {
            assert_eq!(
                s.parse::<Throttle>(),
                Ok(Throttle {
                    seller: seller.into(),
                    limit,
                    period: Duration::from_millis(period_ms)
                }),
                "{s}"
            );
        };
        ok("seller-3=40/10s", "seller-3", 40, 10_000);
        ok("a=b=1/1m", "a=b", 1, 60_000);
        ok(" s = 5 / 250ms ", "s", 5, 250);
        let cases: Vec<(u32, &str, ThrottleError)> = vec![
            (1, "seller-3", ThrottleError::Shape("seller-3".into())),
            (2, "seller-3=40", ThrottleError::Shape("seller-3=40".into())),
            (3, "=4/1s", ThrottleError::EmptySeller("=4/1s".into())),
            (
                4,
                "s=0/1s",
                ThrottleError::BadLimit {
                    spec: "s=0/1s".into(),
                    n: "0".into(),
                },
            ),
            (
                5,
                "s=x/1s",
                ThrottleError::BadLimit {
                    spec: "s=x/1s".into(),
                    n: "x".into(),
                },
            ),
            (
                6,
                "s=4/soon",
                ThrottleError::BadPeriod {
                    spec: "s=4/soon".into(),
                    period: "soon".into(),
                },
            ),
            (
                7,
                "s=4/0s",
                ThrottleError::BadPeriod {
                    spec: "s=4/0s".into(),
                    period: "0s".into(),
                },
            ),
        ];
        for (row, spec, want) in cases {
            assert_eq!(spec.parse::<Throttle>(), Err(want), "row {row}");
        }
    }

    fn shared(config: StubConfig) -> Shared {
        Shared::new(config)
    }

    #[test]
    fn a_throttled_seller_gets_429_past_its_limit_and_others_do_not() {
        let s = shared(StubConfig {
            throttle: vec!["a=3/1h".parse().unwrap()],
            ..Default::default()
        });
        let answers: Vec<Option<u64>> = (0..5).map(|i| s.record("a", &format!("a{i}"))).collect();
        assert_eq!(&answers[..3], &[None, None, None]);
        // The window is an hour from the start: the wait is (almost) all of it.
        for ra in &answers[3..] {
            let secs = ra.expect("429 past the limit");
            assert!((3599..=3600).contains(&secs), "{secs}");
        }
        assert!((0..10).all(|i| s.record("b", &format!("b{i}")).is_none()));
        let st = s.stats();
        assert_eq!(
            (
                st.sellers["a"].calls,
                st.sellers["a"].accepted,
                st.sellers["a"].throttled
            ),
            (5, 3, 2)
        );
        assert_eq!(st.sellers["b"].arrivals_us.len(), 10);
        assert!(st.sellers["b"].arrivals_us.windows(2).all(|w| w[0] <= w[1]));
        let jobs = s.lock().jobs.clone();
        assert_eq!(
            jobs["a4"],
            JobStats {
                calls: 1,
                accepted: 0
            }
        );
        assert_eq!(
            jobs["a0"],
            JobStats {
                calls: 1,
                accepted: 1
            }
        );
    }

    #[test]
    fn a_new_window_accepts_again() {
        let s = shared(StubConfig {
            throttle: vec!["a=1/50ms".parse().unwrap()],
            ..Default::default()
        });
        assert_eq!(s.record("a", "1"), None);
        assert_eq!(s.record("a", "2"), Some(1), "Retry-After is at least 1 s");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(s.record("a", "3"), None);
    }

    #[test]
    fn faults_count_twice_or_forget() {
        let s = shared(StubConfig {
            faults: Faults {
                double_count: ["d".to_owned()].into(),
                forget: ["f".to_owned()].into(),
            },
            ..Default::default()
        });
        s.record("d", "d1");
        s.record("f", "f1");
        let st = s.stats();
        assert_eq!(st.sellers["d"].calls, 2);
        assert_eq!(st.sellers["d"].arrivals_us.len(), 2);
        assert!(!st.sellers.contains_key("f"));
        assert!(!s.lock().jobs.contains_key("f1"));
    }

    #[tokio::test]
    async fn serves_registrations_stats_and_jobs_over_http() {
        let stub = Stub::start(
            "127.0.0.1:0".parse().unwrap(),
            StubConfig {
                throttle: vec!["slow=1/1h".parse().unwrap()],
                fail: ["broken".to_owned()].into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        // The worker's own client, so the headers are the ones it sends.
        let client =
            crate::downstream::Downstream::new(&stub.url(), Duration::from_secs(2), 4).unwrap();
        let limits = crate::config::load_from(None, Vec::new())
            .unwrap()
            .settings
            .worker;
        let job = |seller: &str, id: &str| {
            let json = format!(r#"{{"job_id":"{id}","seller_id":"{seller}","payload":{{}}}}"#);
            crate::job::Job::parse(json.as_bytes(), &limits).unwrap()
        };
        use crate::downstream::{Answer, RetryAfter};
        assert_eq!(client.send(&job("fast", "j1")).await, Answer::Done);
        // A seller the stub fails (--fail) gets a 500, the job's own
        // failure (retried, then dead-lettered as attempts_exhausted).
        assert!(
            matches!(
                client.send(&job("broken", "j0")).await,
                Answer::Retryable { .. }
            ),
            "--fail answers 500"
        );
        assert_eq!(stub.stats().sellers["broken"].failed, 1);
        assert_eq!(stub.stats().sellers["broken"].calls, 0);
        assert_eq!(client.send(&job("slow", "j2")).await, Answer::Done);
        match client.send(&job("slow", "j3")).await {
            Answer::Throttled(RetryAfter::Wait(d)) => {
                assert!((3599..=3600).contains(&d.as_secs()), "{d:?}")
            }
            other => panic!("expected a 429 with Retry-After, got {other:?}"),
        }
        // A call without the worker's headers is refused.
        let raw = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut conn = tokio::net::TcpStream::connect(stub.addr()).await.unwrap();
            conn.write_all(
                b"POST /registrations HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await
            .unwrap();
            let mut out = String::new();
            conn.read_to_string(&mut out).await.unwrap();
            out
        };
        let answer = raw.await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        let base = format!("http://{}", stub.addr());
        let text = crate::downstream::get_text(&format!("{base}/stats"), Duration::from_secs(2))
            .await
            .unwrap();
        let st: Stats = serde_json::from_str(&text).unwrap();
        assert_eq!(st.sellers["slow"].calls, 2);
        assert_eq!(st.sellers["slow"].throttled, 1);
        assert_eq!(st.sellers["fast"].accepted, 1);
        assert_eq!(st, {
            let mut now = stub.stats();
            now.uptime_us = st.uptime_us;
            now
        });
        let text = crate::downstream::get_text(&format!("{base}/jobs"), Duration::from_secs(2))
            .await
            .unwrap();
        let jobs: BTreeMap<String, JobStats> = serde_json::from_str(&text).unwrap();
        assert_eq!(jobs.len(), 3, "{jobs:?}");
        assert_eq!(jobs["j3"].accepted, 0);
        assert_eq!(stub.recent_calls(Duration::from_secs(60))["slow"], 2);
    }
}
