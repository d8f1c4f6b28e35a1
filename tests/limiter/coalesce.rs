//! Coalescing: many sellers' asks in one limiter call, with exactly the
//! decisions one call per ask would give (issue 10). On a private
//! `redis-server`, so that its command counts are this test's alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis_server::{limiter_calls, RedisServer};
use crate::common::{policy, rule};
use throttle_worker::config::Topology;
use throttle_worker::limiter::{
    BatchDecision, CoalesceError, CoalesceSettings, Coalescer, KeySpace, Limiter, LimiterError,
    RedisStore,
};

async fn coalescer(server: &RedisServer, settings: CoalesceSettings) -> Coalescer<RedisStore> {
    let store = RedisStore::connect(&server.url(), Duration::from_secs(5))
        .await
        .expect("private redis-server");
    let lim = Limiter::new(
        store,
        KeySpace::new("co"),
        policy(vec![rule("fixed_window", 5, "1h", None)], vec![]),
        Topology::Single,
    );
    Coalescer::start(Arc::new(lim), settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_asks_share_calls_and_each_seller_gets_its_limit_exactly() {
    let server = RedisServer::start();
    let co = coalescer(&server, CoalesceSettings::default()).await;
    let before = limiter_calls(server.port);
    // 40 sellers, 10 asks of one job each, all at once: 400 asks.
    let mut tasks = Vec::new();
    for round in 0..10 {
        for s in 0..40 {
            let co = co.clone();
            tasks.push(tokio::spawn(async move {
                let seller = format!("seller-{s}");
                let d = co.acquire_jobs(&seller, &[1]).await.expect("a decision");
                (seller, round, d)
            }));
        }
    }
    let mut granted: HashMap<String, u64> = HashMap::new();
    let mut refused = 0;
    for t in tasks {
        let (seller, _, d) = t.await.unwrap();
        match d {
            BatchDecision::Granted(g) => *granted.entry(seller).or_default() += g.units,
            BatchDecision::Denied(d) => {
                assert!(d.retry_after > Duration::ZERO, "{d:?}");
                refused += 1;
            }
            BatchDecision::Never(c) => panic!("cost 1 fits a limit of 5: {c:?}"),
        }
    }
    let calls = limiter_calls(server.port) - before;
    println!("400 asks, {calls} limiter calls, {refused} refused");
    assert_eq!(granted.len(), 40);
    for (seller, n) in &granted {
        assert_eq!(*n, 5, "{seller} granted {n} of a limit of 5");
    }
    assert_eq!(refused, 200);
    assert!(
        calls < 400 / 2,
        "400 asks arriving together took {calls} calls: not coalesced"
    );
}

#[tokio::test]
async fn max_one_sends_every_ask_on_its_own() {
    let server = RedisServer::start();
    let co = coalescer(
        &server,
        CoalesceSettings {
            max: 1,
            ..CoalesceSettings::default()
        },
    )
    .await;
    let before = limiter_calls(server.port);
    let asks: Vec<_> = (0..20)
        .map(|i| {
            let co = co.clone();
            tokio::spawn(async move { co.acquire_jobs(&format!("s{i}"), &[1]).await })
        })
        .collect();
    for a in asks {
        assert!(matches!(a.await.unwrap(), Ok(BatchDecision::Granted(_))));
    }
    assert_eq!(limiter_calls(server.port) - before, 20);
}

#[tokio::test]
async fn a_window_gathers_asks_that_arrive_apart() {
    let server = RedisServer::start();
    let co = coalescer(
        &server,
        CoalesceSettings {
            window: Duration::from_millis(1),
            in_flight: 1,
            ..CoalesceSettings::default()
        },
    )
    .await;
    let before = limiter_calls(server.port);
    let mut asks = Vec::new();
    for i in 0..10 {
        let co = co.clone();
        asks.push(tokio::spawn(async move {
            co.acquire_jobs(&format!("s{i}"), &[1]).await
        }));
        // Apart, but well within one window of the first.
        tokio::time::sleep(Duration::from_micros(20)).await;
    }
    for a in asks {
        assert!(matches!(a.await.unwrap(), Ok(BatchDecision::Granted(_))));
    }
    let calls = limiter_calls(server.port) - before;
    assert!(calls < 10, "10 asks within 1 ms took {calls} calls");
}

/// A window below tokio's millisecond timer grain is waited out by polling
/// between the other tasks' turns: every ask is decided, and the asks that
/// queue meanwhile share calls. (How much latency it adds is measured by
/// `cargo bench --bench redis_cost`, part 3, not here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_millisecond_window_decides_every_ask() {
    let server = RedisServer::start();
    let co = coalescer(
        &server,
        CoalesceSettings {
            window: Duration::from_micros(200),
            in_flight: 1,
            ..CoalesceSettings::default()
        },
    )
    .await;
    let before = limiter_calls(server.port);
    let asks: Vec<_> = (0..50)
        .map(|i| {
            let co = co.clone();
            tokio::spawn(async move { co.acquire_jobs(&format!("s{i}"), &[1]).await })
        })
        .collect();
    for a in asks {
        let d = tokio::time::timeout(Duration::from_secs(10), a)
            .await
            .expect("an ask of a 200 µs window answered within 10 s");
        assert!(matches!(d.unwrap(), Ok(BatchDecision::Granted(_))));
    }
    let calls = limiter_calls(server.port) - before;
    assert!(
        (1..50).contains(&calls),
        "50 asks sent at once took {calls} calls"
    );
}

#[tokio::test]
async fn a_bad_ask_fails_alone_and_a_dead_redis_fails_every_ask() {
    let mut server = RedisServer::start();
    let co = coalescer(&server, CoalesceSettings::default()).await;
    let (bad, good) = tokio::join!(co.acquire_jobs("a", &[]), co.acquire_jobs("b", &[1]));
    assert!(
        matches!(bad, Err(CoalesceError::Limiter(ref e)) if matches!(**e, LimiterError::NoJobs)),
        "{bad:?}"
    );
    assert!(matches!(good, Ok(BatchDecision::Granted(_))), "{good:?}");
    server.stop();
    let (x, y) = tokio::join!(co.acquire_jobs("a", &[1]), co.acquire_jobs("b", &[1]));
    for r in [x, y] {
        match r {
            Err(CoalesceError::Limiter(e)) => {
                assert!(matches!(*e, LimiterError::Store(_)), "{e:?}")
            }
            other => panic!("Redis is down, yet {other:?}"),
        }
    }
}
