//! Redis faults as the limiter sees them (issue 6, defect 4). A Redis whose
//! connection goes silent (a hung host, a network that drops packets, a
//! failover that moved its address) must not keep every seller refused
//! until the kernel gives the socket up: a timed-out connection is
//! replaced.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{policy, rule, unique_prefix};
use throttle_worker::config::Topology;
use throttle_worker::limiter::{KeySpace, Limiter, Mode, RedisStore};

/// A TCP proxy in front of Redis that can go silent: while `silent`, it
/// forwards nothing, and a connection that saw the silence stays dead
/// afterwards (its packets are lost for good); new connections work.
struct Proxy {
    addr: std::net::SocketAddr,
    silent: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = Arc::new(AtomicBool::new(false));
        let flag = silent.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let dead = Arc::new(AtomicBool::new(false));
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, flag.clone(), dead.clone()));
                tokio::spawn(pipe(sr, cw, flag.clone(), dead));
            }
        });
        Proxy { addr, silent }
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
    dead: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if silent.load(Ordering::Relaxed) {
            dead.store(true, Ordering::Relaxed);
        }
        if dead.load(Ordering::Relaxed) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn upstream() -> String {
    let url = common::redis_url();
    let rest = url.trim_start_matches("redis://");
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced_within_two_seconds() {
    let proxy = Proxy::start(upstream()).await;
    let store = RedisStore::connect(
        &format!("redis://{}", proxy.addr),
        Duration::from_millis(200),
    )
    .await
    .expect("Redis through the proxy");
    let limiter = Limiter::new(
        store,
        KeySpace::new(unique_prefix("silent")),
        policy(vec![rule("gcra", 1000, "1s", None)], vec![]),
        Topology::Single,
    );
    limiter
        .acquire("s", 1, Mode::AllOrNothing)
        .await
        .expect("a call before the fault");
    proxy.silent.store(true, Ordering::Relaxed);
    let mut failures = 0;
    let fault = Instant::now();
    while fault.elapsed() < Duration::from_secs(1) {
        if limiter.acquire("s", 1, Mode::AllOrNothing).await.is_err() {
            failures += 1;
        }
    }
    assert!(failures > 0, "calls succeeded through a silent connection");
    proxy.silent.store(false, Ordering::Relaxed);
    let back = Instant::now();
    let recovered = loop {
        if limiter.acquire("s", 1, Mode::AllOrNothing).await.is_ok() {
            break back.elapsed();
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "no limiter call succeeded within 10 s after Redis was reachable again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("{failures} calls failed while silent; first success {recovered:?} after the path came back");
    assert!(
        recovered <= Duration::from_secs(2),
        "first success {recovered:?} after Redis was reachable again (target 2 s)"
    );
}

/// `/readyz` goes 503 naming Redis after `redis.unready_after` failed
/// limiter calls in a row, and back to 200 with the next success; the jobs
/// that waited meanwhile are neither lost nor called without a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_redis_down_and_recovers() {
    use common::worker::{job, Bench, Downstream, Running};
    let proxy = Proxy::start(upstream()).await;
    let bench = Bench::new("readyz", 1);
    let downstream = Downstream::start(common::worker::always_ok()).await;
    let mut settings = bench.settings(&downstream.url);
    settings.redis.url = format!("redis://{}", proxy.addr);
    settings.redis.timeout = Duration::from_millis(200);
    settings.redis.unready_after = 2;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    settings.http.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let worker = Running::start(
        settings,
        common::worker::policy(vec![rule("gcra", 1000, "1s", None)]),
    );
    let http = reqwest::Client::new();
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let status = |wanted: u16, what: &'static str| {
        let http = http.clone();
        let readyz = readyz.clone();
        async move {
            let start = Instant::now();
            loop {
                if let Ok(r) = http.get(&readyz).send().await {
                    let code = r.status().as_u16();
                    let body = r.text().await.unwrap_or_default();
                    if code == wanted {
                        return body;
                    }
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "/readyz never answered {wanted} ({what})"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    status(200, "worker up").await;
    bench.produce(&[job("before", "s1")]).await;
    downstream
        .wait_for("the job before the fault", Duration::from_secs(20), |a| {
            a.len() == 1
        })
        .await;

    proxy.silent.store(true, Ordering::Relaxed);
    bench
        .produce(&[job("during-1", "s1"), job("during-2", "s2")])
        .await;
    let body = status(503, "Redis silent").await;
    assert!(body.contains("Redis"), "503 body names Redis: {body:?}");
    assert_eq!(downstream.count(), 1, "a job was called without a grant");

    proxy.silent.store(false, Ordering::Relaxed);
    status(200, "Redis back").await;
    downstream
        .wait_for("the jobs that waited", Duration::from_secs(20), |a| {
            a.len() == 3
        })
        .await;
    let summary = worker.stop().await;
    assert_eq!(downstream.count(), 3, "{summary:?}");
}
