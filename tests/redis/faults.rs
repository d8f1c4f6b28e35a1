//! Redis faults as the limiter sees them (issue 6, defect 4). A Redis whose
//! connection goes silent (a hung host, a network that drops packets, a
//! failover that moved its address) must not keep every seller refused
//! until the kernel gives the socket up: a timed-out connection is
//! replaced.


use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::{policy, rule, unique_prefix};
use throttle_worker::config::{OnError, Topology};
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
    let url = crate::common::redis_url();
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

/// `/readyz` goes 503 naming Redis after `redis.unready_after_failures` failed
/// limiter calls in a row, and back to 200 with the next success; the jobs
/// that waited meanwhile are neither lost nor called without a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_redis_down_and_recovers() {
    use crate::common::worker::{job, Bench, Downstream, Running};
    let proxy = Proxy::start(upstream()).await;
    let bench = Bench::new("readyz", 1);
    let downstream = Downstream::start(crate::common::worker::always_ok()).await;
    let mut settings = bench.settings(&downstream.url);
    settings.redis.url = format!("redis://{}", proxy.addr);
    settings.redis.timeout = Duration::from_millis(200);
    settings.redis.unready_after_failures = 2;
    let port = crate::common::free_port();
    settings.http.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let worker = Running::start(
        settings,
        crate::common::worker::policy(vec![rule("gcra", 1000, "1s", None)]),
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
    let back = Instant::now();
    downstream
        .wait_for("a job that waited", Duration::from_secs(20), |a| {
            a.len() >= 2
        })
        .await;
    println!(
        "fail_closed: first call {:?} after Redis was reachable again",
        back.elapsed()
    );
    status(200, "Redis back").await;
    downstream
        .wait_for("the jobs that waited", Duration::from_secs(20), |a| {
            a.len() == 3
        })
        .await;
    let summary = worker.stop().await;
    assert_eq!(downstream.count(), 3, "{summary:?}");
}

/// A worker whose Redis sits behind `proxy`, with `on_error` and `rules`.
async fn worker_behind(
    proxy: &Proxy,
    name: &str,
    partitions: i32,
    on_error: OnError,
    rules: Vec<throttle_worker::config::RuleConfig>,
) -> (
    crate::common::worker::Bench,
    crate::common::worker::Downstream,
    crate::common::worker::Running,
) {
    use crate::common::worker::{always_ok, Bench, Downstream, Running};
    let bench = Bench::new(name, partitions);
    let downstream = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&downstream.url);
    settings.redis.url = format!("redis://{}", proxy.addr);
    settings.redis.timeout = Duration::from_millis(200);
    settings.redis.on_error = on_error;
    let worker = Running::start(settings, crate::common::worker::policy(rules));
    (bench, downstream, worker)
}

/// `redis.on_error = "fail_open"`: while Redis is silent, jobs still reach
/// the downstream (unchecked), none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_lets_jobs_through_while_redis_is_silent() {
    use crate::common::worker::job;
    let proxy = Proxy::start(upstream()).await;
    let (bench, downstream, worker) = worker_behind(
        &proxy,
        "fail-open",
        2,
        OnError::FailOpen,
        vec![rule("gcra", 1000, "1s", None)],
    )
    .await;
    bench.produce(&[job("before", "s1")]).await;
    downstream
        .wait_for("the job before the fault", Duration::from_secs(20), |a| {
            a.len() == 1
        })
        .await;
    proxy.silent.store(true, Ordering::Relaxed);
    let during: Vec<_> = (0..20)
        .map(|i| job(&format!("d{i}"), &format!("s{}", i % 4)))
        .collect();
    bench.produce(&during).await;
    downstream
        .wait_for(
            "every job, with Redis silent",
            Duration::from_secs(20),
            |a| a.len() == 21,
        )
        .await;
    proxy.silent.store(false, Ordering::Relaxed);
    worker.stop().await;
    assert_eq!(downstream.count(), 21);
}

/// `redis.on_error = "local"`: while Redis is silent, the one replica that
/// holds every partition enforces the whole limit in memory: jobs keep
/// flowing, at no more than the limit; after Redis is back, the rest pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_enforces_the_replicas_share_while_redis_is_silent() {
    use crate::common::worker::job;
    let proxy = Proxy::start(upstream()).await;
    let limit = 5;
    let (bench, downstream, worker) = worker_behind(
        &proxy,
        "local",
        2,
        OnError::Local,
        vec![rule("sliding_window_log", limit, "1s", None)],
    )
    .await;
    bench.produce(&[job("before", "hot")]).await;
    downstream
        .wait_for("the job before the fault", Duration::from_secs(20), |a| {
            a.len() == 1
        })
        .await;
    // Into the next window, so the pre-fault call is not counted twice.
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.silent.store(true, Ordering::Relaxed);
    let silent_at = Instant::now();
    let during: Vec<_> = (0..30).map(|i| job(&format!("d{i}"), "hot")).collect();
    bench.produce(&during).await;
    downstream
        .wait_for(
            "jobs flowing with Redis silent",
            Duration::from_secs(20),
            |a| a.len() >= 11,
        )
        .await;
    let arrivals = downstream.arrivals();
    let took = silent_at.elapsed();
    proxy.silent.store(false, Ordering::Relaxed);
    let mut times: Vec<Instant> = arrivals.iter().skip(1).map(|a| a.at).collect();
    times.sort();
    let window = Duration::from_millis(900);
    let mut busiest = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi].duration_since(times[lo]) >= window {
            lo += 1;
        }
        busiest = busiest.max(hi - lo + 1);
    }
    println!(
        "{} calls in {took:?} with Redis silent; busiest 900 ms: {busiest} (limit {limit}/1s)",
        times.len()
    );
    assert!(
        busiest <= limit as usize,
        "local fallback let {busiest} through in 900 ms"
    );
    downstream
        .wait_for(
            "every job after Redis is back",
            Duration::from_secs(30),
            |a| a.len() == 31,
        )
        .await;
    worker.stop().await;
}
