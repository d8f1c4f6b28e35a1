//! The downstream HTTP API: the only module that imports `reqwest`.
//!
//! [`Downstream::call`] sends one job and classifies the answer into an
//! [`Outcome`]; the worker decides what each outcome means for the record
//! (commit, wait, retry topic, dead letter). [`backoff`] is the retry delay
//! for [`Outcome::Retryable`].

use std::error::Error as _;
use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use tokio::sync::Semaphore;

use crate::job::Job;

/// The wait used for a 429 whose `Retry-After` is missing or unreadable.
/// One second is the smallest unit `Retry-After` can express, so it is the
/// shortest wait that still honours "the server asked us to slow down".
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How much of an error response's body goes into a fatal reason (which
/// becomes a dead letter's `x-error` header, so it must stay short).
const BODY_EXCERPT_BYTES: usize = 256;

/// Why a [`Downstream`] could not be built. Each message names the config
/// key to fix.
#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    #[error("downstream.url {url:?} is not a valid URL ({reason}); expected an absolute URL such as http://orders-api:8080/v1/jobs")]
    InvalidUrl { url: String, reason: String },
    #[error("downstream.url {url:?} uses scheme {scheme:?}; only http and https are supported")]
    UnsupportedScheme { url: String, scheme: String },
    #[error("downstream.concurrency must be at least 1")]
    ZeroConcurrency,
    #[error("downstream.timeout must be greater than zero")]
    ZeroTimeout,
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

/// What one call's answer means for the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the job is done.
    Done,
    /// 429: do not call again for this seller before this much time has
    /// passed (from `Retry-After`, else [`DEFAULT_RETRY_AFTER`]).
    RetryAfter(Duration),
    /// 5xx, timeout, connection or transport error: worth another attempt
    /// after [`backoff`].
    Retryable { reason: String },
    /// Any other status (4xx except 429, 1xx, 3xx): retrying will not help.
    /// `status` is `None` only when the request could not even be built.
    Fatal { status: Option<u16>, reason: String },
}

/// A client for the downstream API with a bound on concurrent calls.
#[derive(Debug)]
pub struct Downstream {
    client: reqwest::Client,
    /// Validated at construction: absolute, http or https.
    url: Url,
    timeout: Duration,
    /// Holds `concurrency` permits; one per call in flight. Never closed.
    permits: Semaphore,
}

impl Downstream {
    /// Validates the settings and builds the client. `timeout` bounds one
    /// whole request (connect, send, response); waiting for a concurrency
    /// permit is not counted.
    pub fn new(
        url: &str,
        timeout: Duration,
        concurrency: usize,
    ) -> Result<Downstream, DownstreamError> {
        let url = parse_url(url)?;
        if concurrency == 0 {
            return Err(DownstreamError::ZeroConcurrency);
        }
        if timeout.is_zero() {
            return Err(DownstreamError::ZeroTimeout);
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            // A 3xx is classified as fatal rather than followed: a POST
            // carrying a job should not silently land somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(concurrency)
            .build()
            .map_err(|e| DownstreamError::Client(error_chain(&e)))?;
        Ok(Downstream {
            client,
            url,
            timeout,
            permits: Semaphore::new(concurrency.min(Semaphore::MAX_PERMITS)),
        })
    }

    /// The validated URL every job is posted to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Posts one job and classifies the answer. Waits for a concurrency
    /// permit first.
    pub async fn call(&self, job: &Job) -> Outcome {
        // The semaphore is owned by `self` and never closed, so acquire can
        // only fail if that invariant is broken; report it as retryable
        // rather than panic inside the worker.
        let Ok(_permit) = self.permits.acquire().await else {
            return Outcome::Retryable {
                reason: "downstream concurrency limiter is closed".to_owned(),
            };
        };
        let seller = match HeaderValue::from_str(job.seller_id.as_str()) {
            Ok(v) => v,
            Err(_) => return fatal_header("seller_id"),
        };
        let key = match HeaderValue::from_str(&job.job_id) {
            Ok(v) => v,
            Err(_) => return fatal_header("job_id"),
        };
        let sent = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key)
            .header("X-Seller-Id", seller)
            .body(job.payload_bytes().to_vec())
            .send()
            .await;
        match sent {
            Ok(response) => classify_response(response).await,
            Err(e) => self.classify_error(&e),
        }
    }

    fn classify_error(&self, e: &reqwest::Error) -> Outcome {
        if e.is_builder() {
            return Outcome::Fatal {
                status: None,
                reason: format!("could not build the downstream request: {}", error_chain(e)),
            };
        }
        let reason = if e.is_timeout() {
            format!("downstream timed out after {:?}", self.timeout)
        } else if e.is_connect() {
            format!("could not connect to the downstream: {}", error_chain(e))
        } else {
            format!("downstream request failed: {}", error_chain(e))
        };
        Outcome::Retryable { reason }
    }
}

fn fatal_header(field: &str) -> Outcome {
    // Job::parse rejects control characters, so this only fires for ids
    // built some other way.
    Outcome::Fatal {
        status: None,
        reason: format!("{field} cannot be sent as an HTTP header value"),
    }
}

fn parse_url(url: &str) -> Result<Url, DownstreamError> {
    let parsed = Url::parse(url).map_err(|e| DownstreamError::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => {
            return Err(DownstreamError::UnsupportedScheme {
                url: url.to_owned(),
                scheme: other.to_owned(),
            })
        }
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(DownstreamError::InvalidUrl {
            url: url.to_owned(),
            reason: "no host".to_owned(),
        });
    }
    Ok(parsed)
}

async fn classify_response(mut response: reqwest::Response) -> Outcome {
    let status = response.status();
    if status.is_success() {
        return Outcome::Done;
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        let header = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok());
        return Outcome::RetryAfter(parse_retry_after(header, SystemTime::now()));
    }
    let excerpt = body_excerpt(&mut response).await;
    let reason = match excerpt {
        Some(body) => format!("downstream answered {status}: {body}"),
        None => format!("downstream answered {status}"),
    };
    if status.is_server_error() {
        Outcome::Retryable { reason }
    } else {
        Outcome::Fatal {
            status: Some(status.as_u16()),
            reason,
        }
    }
}

/// The first bytes of the body as one line of text, for the reason string.
/// A body that cannot be read is simply left out.
async fn body_excerpt(response: &mut reqwest::Response) -> Option<String> {
    let mut bytes = Vec::new();
    while bytes.len() < BODY_EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(BODY_EXCERPT_BYTES);
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// Reads a `Retry-After` value: delta-seconds (`"120"`) or an HTTP date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), relative to `now`. A date in the past
/// means zero. Missing or unreadable → [`DEFAULT_RETRY_AFTER`].
pub fn parse_retry_after(header: Option<&str>, now: SystemTime) -> Duration {
    let Some(value) = header.map(str::trim) else {
        return DEFAULT_RETRY_AFTER;
    };
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse::<u64>()
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_RETRY_AFTER);
    }
    match httpdate::parse_http_date(value) {
        Ok(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
        Err(_) => DEFAULT_RETRY_AFTER,
    }
}

/// The delay before retry number `attempt` (1 = first retry), exponential
/// with "equal jitter": the ceiling is `min(max, base * 2^(attempt-1))` and
/// the delay is uniform in `[ceiling/2, ceiling]`.
///
/// Equal rather than full jitter: full jitter can pick a delay near zero,
/// which against a failing downstream looks like a tight loop; equal jitter
/// keeps at least half the ceiling while still spreading replicas apart.
/// `attempt` 0 is treated as 1.
///
/// ```
/// use std::time::Duration;
/// use throttle_worker::downstream::backoff;
///
/// let d = backoff(3, Duration::from_millis(100), Duration::from_secs(10));
/// assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
/// ```
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    backoff_with(attempt, base, max, &mut rand::rng())
}

/// [`backoff`] with the random source passed in, for deterministic tests.
pub fn backoff_with<R: Rng + ?Sized>(
    attempt: u32,
    base: Duration,
    max: Duration,
    rng: &mut R,
) -> Duration {
    let ceiling = backoff_ceiling(attempt, base, max);
    // Work in nanoseconds; saturate above u64 (584 years), far beyond any
    // sensible max.
    let ceiling_ns = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    let half = ceiling_ns / 2;
    let jitter = rng.random_range(0..=ceiling_ns - half);
    Duration::from_nanos(half + jitter)
}

/// `min(max, base * 2^(attempt-1))` without overflow.
pub fn backoff_ceiling(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exponent = attempt.max(1) - 1;
    let factor = 1u32.checked_shl(exponent).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(max).min(max)
}

/// An error and its sources on one line: reqwest's own message alone
/// ("error sending request") hides the useful part.
fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode as AxStatus};
    use axum::response::IntoResponse;
    use axum::routing::post;
    use axum::Router;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Everything the test server saw: headers and body per request.
    type Seen = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

    #[derive(Clone, Default)]
    struct Server {
        seen: Seen,
        in_flight: Arc<AtomicUsize>,
        max_in_flight: Arc<AtomicUsize>,
    }

    async fn record(State(s): State<Server>, headers: HeaderMap, body: Bytes) -> AxStatus {
        s.seen.lock().unwrap().push((headers, body));
        AxStatus::OK
    }

    async fn status(Path(code): Path<u16>) -> impl IntoResponse {
        (AxStatus::from_u16(code).unwrap(), "line one\nline two")
    }

    async fn too_many(Path(kind): Path<String>) -> impl IntoResponse {
        let mut headers = HeaderMap::new();
        let value = match kind.as_str() {
            "seconds" => Some("7".to_owned()),
            "date" => Some(httpdate::fmt_http_date(
                SystemTime::now() + Duration::from_secs(30),
            )),
            "garbage" => Some("soon".to_owned()),
            _ => None,
        };
        if let Some(v) = value {
            headers.insert("retry-after", v.parse().unwrap());
        }
        (AxStatus::TOO_MANY_REQUESTS, headers)
    }

    async fn slow() -> AxStatus {
        tokio::time::sleep(Duration::from_secs(5)).await;
        AxStatus::OK
    }

    async fn busy(State(s): State<Server>) -> AxStatus {
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        AxStatus::OK
    }

    /// Starts the test server on an ephemeral loopback port; it stops with
    /// the test's runtime.
    async fn serve() -> (SocketAddr, Server) {
        let server = Server::default();
        let app = Router::new()
            .route("/ok", post(record))
            .route("/status/{code}", post(status))
            .route("/429/{kind}", post(too_many))
            .route("/slow", post(slow))
            .route("/busy", post(busy))
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr, server)
    }

    fn job(payload: &str) -> Job {
        let value = format!(r#"{{"job_id":"job-1","seller_id":"seller-9","payload":{payload}}}"#);
        Job::parse(value.as_bytes(), 1 << 20).unwrap()
    }

    fn client(addr: SocketAddr, path: &str) -> Downstream {
        Downstream::new(
            &format!("http://{addr}{path}"),
            Duration::from_millis(500),
            4,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn posts_payload_verbatim_with_headers() {
        let (addr, server) = serve().await;
        let payload = r#"{ "b" : 1.50, "a": ["x"] }"#;
        let outcome = client(addr, "/ok").call(&job(payload)).await;
        assert_eq!(outcome, Outcome::Done);
        let seen = server.seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "exactly one request");
        let (headers, body) = &seen[0];
        assert_eq!(
            &body[..],
            payload.as_bytes(),
            "body is the payload byte for byte"
        );
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["idempotency-key"], "job-1");
        assert_eq!(headers["x-seller-id"], "seller-9");
    }

    #[tokio::test]
    async fn classifies_statuses() {
        let (addr, _server) = serve().await;
        let reason = |code: u16| {
            let text = AxStatus::from_u16(code).unwrap().to_string();
            format!("downstream answered {text}: line one line two")
        };
        let cases: Vec<(u32, &str, Outcome)> = vec![
            (1, "/status/200", Outcome::Done),
            (2, "/status/204", Outcome::Done),
            (
                3,
                "/status/500",
                Outcome::Retryable {
                    reason: reason(500),
                },
            ),
            (
                4,
                "/status/503",
                Outcome::Retryable {
                    reason: reason(503),
                },
            ),
            (
                5,
                "/status/400",
                Outcome::Fatal {
                    status: Some(400),
                    reason: reason(400),
                },
            ),
            (
                6,
                "/status/404",
                Outcome::Fatal {
                    status: Some(404),
                    reason: reason(404),
                },
            ),
            (
                7,
                "/status/409",
                Outcome::Fatal {
                    status: Some(409),
                    reason: reason(409),
                },
            ),
            (
                8,
                "/status/302",
                Outcome::Fatal {
                    status: Some(302),
                    reason: reason(302),
                },
            ),
            (
                9,
                "/429/seconds",
                Outcome::RetryAfter(Duration::from_secs(7)),
            ),
            (10, "/429/none", Outcome::RetryAfter(DEFAULT_RETRY_AFTER)),
            (11, "/429/garbage", Outcome::RetryAfter(DEFAULT_RETRY_AFTER)),
        ];
        for (row, path, want) in cases {
            let got = client(addr, path).call(&job("1")).await;
            assert_eq!(got, want, "row {row}: POST {path}");
        }
        // An HTTP date 30 s ahead, at one-second resolution.
        match client(addr, "/429/date").call(&job("1")).await {
            Outcome::RetryAfter(d) => assert!(
                d > Duration::from_secs(28) && d <= Duration::from_secs(30),
                "date-based retry-after {d:?}"
            ),
            other => panic!("429 with a date: got {other:?}"),
        }
    }

    #[tokio::test]
    async fn timeout_and_refused_connection_are_retryable() {
        let (addr, _server) = serve().await;
        let slow = Downstream::new(
            &format!("http://{addr}/slow"),
            Duration::from_millis(100),
            1,
        )
        .unwrap();
        match slow.call(&job("1")).await {
            Outcome::Retryable { reason } => assert!(reason.contains("timed out"), "{reason}"),
            other => panic!("slow server: got {other:?}"),
        }
        // A port that was just free: nothing listens there.
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        match client(free, "/ok").call(&job("1")).await {
            Outcome::Retryable { reason } => assert!(reason.contains("connect"), "{reason}"),
            other => panic!("refused connection: got {other:?}"),
        }
    }

    #[tokio::test]
    async fn concurrency_is_bounded() {
        let (addr, server) = serve().await;
        let downstream =
            Downstream::new(&format!("http://{addr}/busy"), Duration::from_secs(2), 2).unwrap();
        let j = job("1");
        let calls = (0..8).map(|_| downstream.call(&j));
        let outcomes = futures::future::join_all(calls).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Done), "{outcomes:?}");
        let max = server.max_in_flight.load(Ordering::SeqCst);
        assert_eq!(
            max, 2,
            "at most 2 calls in flight, and the bound is reached"
        );
    }

    #[test]
    fn construction_errors_name_what_to_fix() {
        let t = Duration::from_secs(1);
        let cases: Vec<(u32, &str, Duration, usize, &str)> = vec![
            (
                1,
                "not a url",
                t,
                1,
                "downstream.url \"not a url\" is not a valid URL",
            ),
            (2, "ftp://host/x", t, 1, "only http and https"),
            (
                3,
                "http://host/x",
                t,
                0,
                "downstream.concurrency must be at least 1",
            ),
            (
                4,
                "http://host/x",
                Duration::ZERO,
                1,
                "downstream.timeout must be greater than zero",
            ),
            (5, "/relative/path", t, 1, "expected an absolute URL"),
        ];
        for (row, url, timeout, conc, want) in cases {
            let err = Downstream::new(url, timeout, conc).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "row {row}: {err:?} should contain {want:?}"
            );
        }
        let ok = Downstream::new("https://api.example.com/v1/jobs", t, 8).unwrap();
        assert_eq!(ok.url(), "https://api.example.com/v1/jobs");
    }

    #[test]
    fn retry_after_parsing() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let cases: Vec<(u32, Option<&str>, Duration)> = vec![
            (1, Some("120"), Duration::from_secs(120)),
            (2, Some(" 0 "), Duration::ZERO),
            (
                3,
                Some("Wed, 21 Oct 2015 07:28:05 GMT"),
                Duration::from_secs(5),
            ),
            (4, Some("Wed, 21 Oct 2015 07:27:00 GMT"), Duration::ZERO),
            (5, None, DEFAULT_RETRY_AFTER),
            (6, Some(""), DEFAULT_RETRY_AFTER),
            (7, Some("-5"), DEFAULT_RETRY_AFTER),
            (8, Some("1.5"), DEFAULT_RETRY_AFTER),
            (9, Some("99999999999999999999999"), DEFAULT_RETRY_AFTER),
            (10, Some("tomorrow"), DEFAULT_RETRY_AFTER),
        ];
        for (row, header, want) in cases {
            assert_eq!(
                parse_retry_after(header, now),
                want,
                "row {row}: {header:?}"
            );
        }
    }

    #[test]
    fn backoff_ceiling_grows_then_caps() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let cases: Vec<(u32, u32, Duration)> = vec![
            (1, 0, Duration::from_millis(100)),
            (2, 1, Duration::from_millis(100)),
            (3, 2, Duration::from_millis(200)),
            (4, 3, Duration::from_millis(400)),
            (5, 6, Duration::from_millis(3200)),
            (6, 7, max),
            (7, 40, max),
            (8, u32::MAX, max),
        ];
        for (row, attempt, want) in cases {
            assert_eq!(
                backoff_ceiling(attempt, base, max),
                want,
                "row {row}: attempt {attempt}"
            );
        }
    }

    #[test]
    fn backoff_stays_in_equal_jitter_bounds_and_spreads() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let mut rng = StdRng::seed_from_u64(7);
        for attempt in 0..50 {
            let ceiling = backoff_ceiling(attempt, base, max);
            let mut distinct = std::collections::HashSet::new();
            for _ in 0..200 {
                let d = backoff_with(attempt, base, max, &mut rng);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "attempt {attempt}: {d:?} outside [{:?}, {ceiling:?}]",
                    ceiling / 2
                );
                distinct.insert(d);
            }
            assert!(
                distinct.len() > 100,
                "attempt {attempt}: jitter spreads delays ({} distinct)",
                distinct.len()
            );
        }
        // The public function uses the thread RNG with the same bounds.
        let d = backoff(3, base, max);
        assert!(
            d >= Duration::from_millis(200) && d <= Duration::from_millis(400),
            "{d:?}"
        );
        assert_eq!(
            backoff(5, Duration::ZERO, max),
            Duration::ZERO,
            "zero base never panics"
        );
    }
}
