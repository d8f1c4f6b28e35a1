//! [`Downstream`] against a live HTTP server on loopback: what a call
//! sends, how each status and each hostile response is classified, timeouts
//! and refused connections, the concurrency bound, construction errors.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode as AxStatus};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;

use super::{Answer, Downstream, RetryAfter};
use crate::job::Job;

/// Everything the test server saw: headers and body per request.
type Seen = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

#[derive(Clone, Default)]
struct Server {
    seen: Seen,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    /// Calls the storm route has answered.
    storm: Arc<AtomicUsize>,
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
        "huge" => Some("10000000000000000000".to_owned()),
        "beyond-u64" => Some("99999999999999999999999999999".to_owned()),
        "negative" => Some("-30".to_owned()),
        "past" => Some("Wed, 21 Oct 2015 07:28:00 GMT".to_owned()),
        "fraction" => Some("1.5".to_owned()),
        _ => None,
    };
    if let Some(v) = value {
        headers.insert("retry-after", v.parse().unwrap());
    }
    match kind.as_str() {
        // Two values: the longest readable one wins.
        "multiple" => {
            headers.append("retry-after", "3".parse().unwrap());
            headers.append("retry-after", "junk".parse().unwrap());
            headers.append("retry-after", "9".parse().unwrap());
        }
        // Bytes that are not visible ASCII: unreadable, so absent.
        "non-ascii" => {
            headers.insert(
                "retry-after",
                axum::http::HeaderValue::from_bytes("5 sécondes".as_bytes()).unwrap(),
            );
        }
        "huge-and-small" => {
            headers.append("retry-after", "2".parse().unwrap());
            headers.append("retry-after", "18446744073709551615".parse().unwrap());
        }
        _ => {}
    }
    (AxStatus::TOO_MANY_REQUESTS, headers)
}

/// A 5xx storm: every status of the class, with bodies a proxy might
/// send (empty, binary, control characters, 256 KiB).
async fn storm(State(s): State<Server>) -> impl IntoResponse {
    let n = s.storm.fetch_add(1, Ordering::SeqCst);
    let codes = [500, 502, 503, 504, 507, 599];
    let body: Vec<u8> = match n % 4 {
        0 => Vec::new(),
        1 => vec![0xff, 0xfe, 0, 1, 2, b'\n', 0x80],
        2 => "bad\r\n\tgateway\u{7}".repeat(50).into_bytes(),
        _ => vec![b'x'; 256 << 10],
    };
    (AxStatus::from_u16(codes[n % codes.len()]).unwrap(), body)
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
        .route("/storm", post(storm))
        .route("/busy", post(busy))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, server)
}

fn job(payload: &str) -> Job {
    let value =
        format!(r#"{{"job_id":"job-1","seller_id":"seller-9","payload":{payload},"cost":3}}"#);
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
    let outcome = client(addr, "/ok").send(&job(payload)).await;
    assert_eq!(outcome, Answer::Done);
    {
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
        assert_eq!(headers["x-job-cost"], "3");
        assert!(
            !headers.contains_key("x-granted-at"),
            "no grant instant, no header: {headers:?}"
        );
    }
    let outcome = client(addr, "/ok")
        .send_granted(&job(payload), Some(1_700_000_000_123_456))
        .await;
    assert_eq!(outcome, Answer::Done);
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen[1].0["x-granted-at"], "1700000000123456");
}

/// The clamp used by the status table: small, to show it applies.
const MAX_RA: Duration = Duration::from_secs(600);

fn wait(d: Duration) -> Answer {
    Answer::Throttled(RetryAfter::Wait(d))
}

fn unspecified() -> Answer {
    Answer::Throttled(RetryAfter::Unspecified)
}

#[tokio::test]
async fn classifies_statuses() {
    let (addr, _server) = serve().await;
    let reason = |code: u16| {
        let text = AxStatus::from_u16(code).unwrap().to_string();
        format!("downstream answered {text}: line one line two")
    };
    let cases: Vec<(u32, &str, Answer)> = vec![
        (1, "/status/200", Answer::Done),
        (2, "/status/204", Answer::Done),
        (
            3,
            "/status/500",
            Answer::Retryable {
                reason: reason(500),
            },
        ),
        (
            4,
            "/status/503",
            Answer::Unreachable {
                reason: reason(503),
            },
        ),
        (
            5,
            "/status/400",
            Answer::Fatal {
                status: Some(400),
                reason: reason(400),
            },
        ),
        // Issue 20, defect 9: both say "try again", and were
        // dead-lettered at once.
        (
            51,
            "/status/408",
            Answer::Retryable {
                reason: reason(408),
            },
        ),
        (
            52,
            "/status/425",
            Answer::Retryable {
                reason: reason(425),
            },
        ),
        (
            53,
            "/status/502",
            Answer::Unreachable {
                reason: reason(502),
            },
        ),
        (
            6,
            "/status/404",
            Answer::Fatal {
                status: Some(404),
                reason: reason(404),
            },
        ),
        (
            7,
            "/status/409",
            Answer::Fatal {
                status: Some(409),
                reason: reason(409),
            },
        ),
        (
            8,
            "/status/302",
            Answer::Fatal {
                status: Some(302),
                reason: reason(302),
            },
        ),
        (9, "/429/seconds", wait(Duration::from_secs(7))),
        (10, "/429/none", unspecified()),
        (11, "/429/garbage", unspecified()),
        (12, "/429/huge", wait(MAX_RA)),
        (13, "/429/beyond-u64", wait(MAX_RA)),
        (14, "/429/negative", wait(Duration::ZERO)),
        (15, "/429/past", wait(Duration::ZERO)),
        (16, "/429/fraction", unspecified()),
        (17, "/429/multiple", wait(Duration::from_secs(9))),
        (18, "/429/non-ascii", unspecified()),
        (19, "/429/huge-and-small", wait(MAX_RA)),
    ];
    for (row, path, want) in cases {
        let got = client(addr, path)
            .with_max_retry_after(MAX_RA)
            .send(&job("1"))
            .await;
        assert_eq!(got, want, "row {row}: POST {path}");
    }
    // An HTTP date 30 s ahead, at one-second resolution.
    match client(addr, "/429/date").send(&job("1")).await {
        Answer::Throttled(RetryAfter::Wait(d)) => assert!(
            d > Duration::from_secs(28) && d <= Duration::from_secs(30),
            "date-based retry-after {d:?}"
        ),
        other => panic!("429 with a date: got {other:?}"),
    }
}

/// Every call tells its answer's class (`DownstreamAnswered`: the
/// `class` label of `throttle_downstream_requests_total`), once, timeouts
/// and refused connections included.
#[tokio::test]
async fn each_call_tells_the_class_of_its_answer() {
    use crate::telemetry::events::{capture, DownstreamAnswered};
    let (addr, _server) = serve().await;
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let slow = Downstream::new(
        &format!("http://{addr}/slow"),
        Duration::from_millis(100),
        1,
    )
    .unwrap();
    let cases: Vec<(u32, Downstream, &str)> = vec![
        (1, client(addr, "/status/204"), "2xx"),
        (2, client(addr, "/429/none"), "429"),
        (3, client(addr, "/status/404"), "4xx"),
        (4, client(addr, "/status/503"), "5xx"),
        (5, client(addr, "/status/302"), "other"),
        (6, slow, "timeout"),
        (7, client(free, "/ok"), "error"),
    ];
    for (row, downstream, class) in cases {
        let seen = capture();
        downstream.send(&job("1")).await;
        let told = seen.of::<DownstreamAnswered>();
        assert_eq!(told.len(), 1, "row {row}: {told:?}");
        assert!(
            told[0].contains(&format!("class: {class:?}")),
            "row {row}: want class {class}, told {told:?}"
        );
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
    match slow.send(&job("1")).await {
        Answer::Unreachable { reason } => assert!(reason.contains("timed out"), "{reason}"),
        other => panic!("slow server: got {other:?}"),
    }
    // A port that was just free: nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    match client(free, "/ok").send(&job("1")).await {
        Answer::Unreachable { reason } => assert!(reason.contains("connect"), "{reason}"),
        other => panic!("refused connection: got {other:?}"),
    }
}

#[tokio::test]
async fn a_5xx_storm_is_retryable_with_short_one_line_reasons() {
    let (addr, server) = serve().await;
    let downstream =
        Downstream::new(&format!("http://{addr}/storm"), Duration::from_secs(5), 8).unwrap();
    let j = job("1");
    let calls = (0..200).map(|n| {
        let (c, j) = (&downstream, &j);
        async move { (n, c.send(j).await) }
    });
    for (n, answer) in futures::future::join_all(calls).await {
        let (Answer::Retryable { reason } | Answer::Unreachable { reason }) = answer else {
            panic!("storm call {n}: got {answer:?}");
        };
        assert!(
            reason.len() <= 400,
            "call {n}: {} byte reason",
            reason.len()
        );
        assert!(
            !reason.chars().any(char::is_control),
            "call {n}: {reason:?}"
        );
    }
    assert_eq!(
        server.storm.load(Ordering::SeqCst),
        200,
        "every call reached the server"
    );
}

/// A server that answers one canned byte string per connection, after
/// reading the request, then closes: responses no framework would send.
async fn raw(response: &'static [u8]) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the head, then as many body bytes as it announces.
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text
                        .split("content-length:")
                        .nth(1)
                        .and_then(|r| r.split("\r\n").next())
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if seen.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let _ = conn.write_all(response).await;
            let _ = conn.shutdown().await;
        }
    });
    addr
}

#[tokio::test]
async fn hostile_responses_classify_and_never_panic() {
    let max = Duration::from_secs(60);
    let ok_429 = |ra: RetryAfter| move |a: &Answer| *a == Answer::Throttled(ra);
    let retryable = |a: &Answer| matches!(a, Answer::Retryable { .. } | Answer::Unreachable { .. });
    type Check = Box<dyn Fn(&Answer) -> bool>;
    let cases: Vec<(u32, &'static [u8], Check)> = vec![
        (
            1,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: \xff\xfe5\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Unspecified)),
        ),
        (
            2,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: -1\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Wait(Duration::ZERO))),
        ),
        (
            3,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nRetry-After: 99999999999999999999999\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Wait(max))),
        ),
        (
            4,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After:\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Unspecified)),
        ),
        (
            5,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5, 10\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Unspecified)),
        ),
        (
            6,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 10000000000000000000\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Wait(max))),
        ),
        (
            7,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\ncontent-length: 0\r\n\r\n",
            Box::new(ok_429(RetryAfter::Wait(max))),
        ),
        // Not HTTP, nothing at all, a truncated 503 body: transport faults.
        (8, b"hello\r\n\r\n", Box::new(retryable)),
        (9, b"", Box::new(retryable)),
        (
            10,
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 100\r\n\r\nonly ten b",
            Box::new(retryable),
        ),
        (
            11,
            b"HTTP/1.1 999 Whatever\r\ncontent-length: 0\r\n\r\n",
            Box::new(|a: &Answer| matches!(a, Answer::Fatal { status: Some(999), .. })),
        ),
        (
            12,
            b"HTTP/1.1 200 OK\r\nX-Bad: a\0b\r\ncontent-length: 0\r\n\r\n",
            Box::new(|a: &Answer| {
                *a == Answer::Done
                    || matches!(a, Answer::Retryable { .. } | Answer::Unreachable { .. })
            }),
        ),
    ];
    for (row, response, check) in cases {
        let addr = raw(response).await;
        let got = client(addr, "/x")
            .with_max_retry_after(max)
            .send(&job("1"))
            .await;
        assert!(check(&got), "row {row}: got {got:?}");
    }
    // A Retry-After of 64 KiB of digits: clamped, or refused by the
    // HTTP parser as too large, never a panic.
    let mut long = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: ".to_vec();
    long.extend(std::iter::repeat_n(b'9', 64 << 10));
    long.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
    let addr = raw(Box::leak(long.into_boxed_slice())).await;
    let got = client(addr, "/x")
        .with_max_retry_after(max)
        .send(&job("1"))
        .await;
    assert!(
        got == Answer::Throttled(RetryAfter::Wait(max)) || retryable(&got),
        "64 KiB Retry-After: got {got:?}"
    );
}

#[tokio::test]
async fn concurrency_is_bounded() {
    let (addr, server) = serve().await;
    let downstream =
        Downstream::new(&format!("http://{addr}/busy"), Duration::from_secs(2), 2).unwrap();
    let j = job("1");
    let calls = (0..8).map(|_| downstream.send(&j));
    let outcomes = futures::future::join_all(calls).await;
    assert!(outcomes.iter().all(|o| *o == Answer::Done), "{outcomes:?}");
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
