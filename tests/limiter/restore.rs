//! Issue 52, item 2: after Redis loses its data, each replica writes back
//! its own grants (`lua/restore.lua`), and a seller goes on from what the
//! fleet had granted, not from nothing, once the bounded hold ends.
//!
//! A private `redis-server` (it is flushed mid-test); rules of an hour,
//! so a fresh start would hand a seller a whole second window.

use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::{policy, rule};
use throttle_worker::config::{OnStateLoss, Topology};
use throttle_worker::limiter::{BatchDecision, KeySpace, Limiter, Policy, RedisStore};

const BOUND: Duration = Duration::from_millis(1500);

fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A replica as the worker builds it: the loss guard, a bounded wait,
/// restores on.
async fn replica(port: u16, name: &str, policy: Policy, restore: bool) -> Limiter<RedisStore> {
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), Duration::from_secs(5))
        .await
        .expect("the private redis-server");
    let l = Limiter::new(store, KeySpace::new("rs"), policy, Topology::Single)
        .with_state_loss(OnStateLoss::Wait)
        .with_state_loss_wait(Some(BOUND));
    if restore {
        l.with_restore(name, 1 << 20)
    } else {
        l
    }
}

/// Jobs of one unit each granted to `seller` now, out of `n` asked.
async fn grant(l: &Limiter<RedisStore>, seller: &str, n: usize) -> u64 {
    match l
        .acquire_jobs(seller, &vec![1; n])
        .await
        .expect("a decision")
    {
        BatchDecision::Granted(g) => g.units,
        _ => 0,
    }
}

fn hourly() -> Policy {
    policy(
        vec![
            rule("fixed_window", 100, "1h", None),
            rule("sliding_window_log", 100, "1h", None),
        ],
        vec![],
    )
}

/// Two replicas grant a seller 30 and 40 of its 100 an hour; Redis loses
/// everything. The seller is held for the bound, during which each
/// replica writes back its part once (a second restore counts nothing);
/// after it, the seller gets the 30 the hour has left, not 100 more.
/// Without restores the same run hands out the whole window again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_loss_each_replica_restores_its_grants_once_and_the_seller_resumes_at_the_bound() {
    let server = RedisServer::start();
    for restore in [true, false] {
        cli(server.port, &["FLUSHALL"]);
        let a = replica(server.port, "a", hourly(), restore).await;
        let b = replica(server.port, "b", hourly(), restore).await;
        // An install whose state was never lost.
        let epoch = a.keys().epoch(Topology::Single, "");
        cli(server.port, &["SET", &epoch, "0"]);
        assert_eq!(grant(&a, "s", 30).await, 30);
        assert_eq!(grant(&b, "s", 40).await, 40);
        assert_eq!(a.watch_epoch().await, None, "no loss yet");

        cli(server.port, &["FLUSHALL"]);
        // The first call after the loss finds it and is held.
        assert_eq!(grant(&a, "s", 1).await, 0, "held by the loss");
        let lost: u64 = cli(server.port, &["GET", &epoch])
            .parse()
            .expect("the epoch");
        let ra = a.watch_epoch().await;
        let rb = b.watch_epoch().await;
        if restore {
            let (ra, rb) = (ra.expect("a restores"), rb.expect("b restores"));
            assert_eq!((ra.lost_us, ra.units, ra.failed), (lost, 60, 0), "{ra:?}");
            assert_eq!((rb.units, rb.failed), (80, 0), "{rb:?}");
            assert_eq!(a.watch_epoch().await, None, "once per loss");
            let again = a.restore_after(lost).await;
            assert_eq!(again.units, 0, "a second restore counts nothing: {again:?}");
            assert_eq!(
                grant(&b, "s", 1).await,
                0,
                "restored, and held until the bound"
            );
        } else {
            assert_eq!((ra, rb), (None, None));
        }
        tokio::time::sleep(BOUND).await;
        let after = grant(&a, "s", 100).await;
        if restore {
            assert_eq!(after, 30, "what the hour had left");
        } else {
            assert_eq!(after, 100, "without restores the window starts over");
        }
    }
}

/// A rule that drains within the bound is left to the loss's whole-use
/// fill (`lost_fill`): a restore writes nothing there and adds no hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_within_the_bound_is_not_restored_nor_held_longer() {
    let server = RedisServer::start();
    let fast = policy(vec![rule("gcra", 10, "1s", None)], vec![]);
    let a = replica(server.port, "a", fast, true).await;
    let epoch = a.keys().epoch(Topology::Single, "");
    cli(server.port, &["SET", &epoch, "0"]);
    assert_eq!(grant(&a, "s", 5).await, 5);
    cli(server.port, &["FLUSHALL"]);
    assert_eq!(grant(&a, "s", 1).await, 0, "a whole use at the loss");
    let r = a.watch_epoch().await.expect("a loss");
    assert_eq!((r.units, r.failed), (0, 0), "{r:?}");
    // The whole use drains in a second, well before the 1.5 s bound.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(grant(&a, "s", 1).await, 1);
}
