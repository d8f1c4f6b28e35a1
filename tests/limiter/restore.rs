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
use throttle_worker::limiter::{
    BatchDecision, KeySpace, Limiter, Policy, RedisStore, RestoreReport,
};

const BOUND: Duration = Duration::from_millis(1500);

fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Redis as an install that has run on this server before finds it: the
/// loss guard's epoch (0: never lost) and the server key naming this
/// server's run id (`server_moved`, `lua/common.lua`). An epoch without
/// the server key reads as a move to an older copy.
fn installed(port: u16, l: &Limiter<RedisStore>) -> String {
    let epoch = l.keys().epoch(Topology::Single, "");
    cli(port, &["SET", &epoch, "0"]);
    let info = cli(port, &["INFO", "server"]);
    let run = info
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .expect("INFO server names the run id")
        .trim();
    cli(port, &["SET", &l.keys().server(), &format!("{run} 0 0")]);
    epoch
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
    granted(
        l.acquire_jobs(seller, &vec![1; n])
            .await
            .expect("a decision"),
    )
}

/// The units a decision granted: none when it refused.
fn granted(d: BatchDecision) -> u64 {
    match d {
        BatchDecision::Granted(g) => g.units,
        _ => 0,
    }
}

/// The units written back and the hashes that failed, a pair per report.
fn units_of(reports: &[RestoreReport]) -> Vec<(u64, usize)> {
    reports.iter().map(|r| (r.units, r.failed)).collect()
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
        let epoch = installed(server.port, &a);
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
    installed(server.port, &a);
    assert_eq!(grant(&a, "s", 5).await, 5);
    cli(server.port, &["FLUSHALL"]);
    assert_eq!(grant(&a, "s", 1).await, 0, "a whole use at the loss");
    let r = a.watch_epoch().await.expect("a loss");
    assert_eq!((r.units, r.failed), (0, 0), "{r:?}");
    // The whole use drains in a second, well before the 1.5 s bound.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(grant(&a, "s", 1).await, 1);
}

/// A DUMP of a key, taken now, to put back later (a partial loss: a
/// failover to a replica that missed the writes since).
async fn dump(port: u16, key: &str) -> (Vec<u8>, i64) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("the private redis-server");
    let bytes: Vec<u8> = redis::cmd("DUMP")
        .arg(key)
        .query_async(&mut c)
        .await
        .expect("DUMP");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut c)
        .await
        .expect("PTTL");
    (bytes, ttl)
}

async fn put_back(port: u16, key: &str, (bytes, ttl): &(Vec<u8>, i64)) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("the private redis-server");
    let () = redis::cmd("RESTORE")
        .arg(key)
        .arg((*ttl).max(0))
        .arg(bytes.as_slice())
        .arg("REPLACE")
        .query_async(&mut c)
        .await
        .expect("RESTORE");
}

/// Issue 52, item 3: a seller's key goes back to an older copy while the
/// epoch stays (as after a failover to a replica that missed the last
/// writes). Two replicas grant 30 and 20 of 100 an hour, the key is
/// copied, they grant 10 and 15 more, and the copy is put back: Redis now
/// says 50. The next call of a replica whose grant is gone finds it,
/// refuses to go on from the older state and holds the seller; each
/// replica reads the find and writes back exactly the grants the state
/// lost (its own after its last grant the state still holds). After the
/// hold the seller gets the 25 the hour has left. Without the marks
/// (restores off) the same run hands out 50 more, 125 in the hour. Run
/// through the general function and through a generated shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seller_key_put_back_from_an_older_copy_is_found_held_and_restored_exactly() {
    let server = RedisServer::start();
    for (restore, shapes) in [(true, false), (true, true), (false, false)] {
        cli(server.port, &["FLUSHALL"]);
        cli(server.port, &["FUNCTION", "FLUSH"]);
        let a = replica(server.port, "a", hourly(), restore).await;
        let b = replica(server.port, "b", hourly(), restore).await;
        if shapes {
            a.prepare_shapes().await.expect("shapes");
            assert!(
                cli(server.port, &["FUNCTION", "LIST"]).contains("_fw_swl"),
                "the seller's shape is loaded, so its calls run through it"
            );
        }
        let epoch = installed(server.port, &a);
        let key = a.keys().seller_state("s");
        assert_eq!(grant(&a, "s", 30).await, 30);
        assert_eq!(grant(&b, "s", 20).await, 20);
        let copy = dump(server.port, &key).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(grant(&a, "s", 10).await, 10);
        assert_eq!(grant(&b, "s", 15).await, 15);
        put_back(server.port, &key, &copy).await;
        assert_eq!(cli(server.port, &["GET", &epoch]), "0", "the epoch stays");

        let first = grant(&b, "s", 1).await;
        let rollbacks = a.keys().rollbacks();
        if !restore {
            assert_eq!(first, 1, "nothing found without the marks");
            assert_eq!(grant(&a, "s", 100).await, 49, "50 more in the hour");
            assert_eq!(cli(server.port, &["EXISTS", &rollbacks]), "0");
            continue;
        }
        assert_eq!(first, 0, "found and held (shapes: {shapes})");
        assert_eq!(grant(&a, "s", 1).await, 0, "held for every replica");
        assert_eq!(cli(server.port, &["ZCARD", &rollbacks]), "1", "one find");
        let ra = a.watch_rollbacks().await;
        let rb = b.watch_rollbacks().await;
        // Two rules each: a's 10 and b's 15, per rule.
        assert_eq!(units_of(&ra), [(20, 0)]);
        assert_eq!(units_of(&rb), [(30, 0)]);
        assert!(a.watch_rollbacks().await.is_empty(), "each find once");
        tokio::time::sleep(BOUND).await;
        assert_eq!(grant(&a, "s", 100).await, 25, "what the hour had left");
        assert_eq!(grant(&b, "s", 1).await, 0, "used up");
        assert_eq!(
            cli(server.port, &["ZCARD", &rollbacks]),
            "1",
            "after the restores nobody finds it again"
        );
    }
}

/// A seller's own hash expires long before a global rule's state would
/// (a GCRA of 10/s drains in a tenth of a second; the global hour does
/// not), and is made again by the next grant: a replica that carries its
/// grant from before, with the hour's reset, must not read the new hash
/// as an older copy (`c0` tells them apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seller_hash_that_expired_under_a_global_rule_is_not_a_partial_loss() {
    let server = RedisServer::start();
    let rules = policy(
        vec![rule("gcra", 10, "1s", None)],
        vec![rule("fixed_window", 100_000, "1h", None)],
    );
    // The product's timeout: a call's record (for its cancel) keeps the
    // hash for four of them, at least a second.
    let replica = |name: &'static str, rules: Policy| async move {
        let store = RedisStore::connect(
            &format!("redis://127.0.0.1:{}", server.port),
            Duration::from_millis(250),
        )
        .await
        .expect("the private redis-server");
        Limiter::new(store, KeySpace::new("rs"), rules, Topology::Single)
            .with_state_loss(OnStateLoss::Wait)
            .with_state_loss_wait(Some(BOUND))
            .with_restore(name, 1 << 20)
    };
    let a = replica("a", rules.clone()).await;
    let b = replica("b", rules).await;
    installed(server.port, &a);
    let key = a.keys().seller_state("s");
    assert_eq!(grant(&a, "s", 1).await, 1);
    // Its slack and grain past, the seller's hash is gone; the global
    // rules' stays.
    let mut waited = Duration::ZERO;
    while cli(server.port, &["EXISTS", &key]) == "1" {
        assert!(
            waited < Duration::from_secs(10),
            "the seller's hash expires"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    // Another replica makes it again first: its `c0` is after a's grant.
    assert_eq!(grant(&b, "s", 1).await, 1);
    assert_eq!(grant(&a, "s", 1).await, 1, "not held: the hash expired");
    assert_eq!(grant(&a, "s", 1).await, 1, "nor on the next call");
    let rollbacks = a.keys().rollbacks();
    assert_eq!(cli(server.port, &["EXISTS", &rollbacks]), "0", "no find");
}

/// Jobs granted as [`grant`] does, once Redis answers again after a
/// restart (the first calls may find the connection gone).
async fn grant_once_back(l: &Limiter<RedisStore>, seller: &str, n: usize) -> u64 {
    let costs = vec![1; n];
    granted(once_back(|| l.acquire_jobs(seller, &costs)).await)
}

/// What `f` answers once Redis answers again after a restart: it is
/// called again every 50 ms while it fails, for 10 s at the most.
async fn once_back<F, Fut, T, E>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let started = std::time::Instant::now();
    loop {
        match f().await {
            Ok(t) => return t,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "Redis did not answer again: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Issue 52, item 3: Redis restarts and loads a save older than its last
/// writes (as a failover to a replica that missed them does), so every
/// key goes back together, the epoch and the replicas' marks with the
/// state. Replica a grants 30 and b 20 of 100 an hour; the save is taken;
/// only b grants 15 more. After the restart a calls first: its own mark
/// is whole (it lost nothing), so no mark can tell it the state went
/// back; the server's new run id does. a is held, the find names every
/// hash, b writes back its 15 per rule and a nothing, and after the hold
/// the seller gets the 35 the hour has left. Without restores the older
/// state hands out 50 more (115 in the hour). Through the general
/// function and a generated shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_loads_an_older_save_holds_even_a_replica_that_lost_nothing() {
    for (restore, shapes) in [(true, false), (true, true), (false, false)] {
        let mut server = RedisServer::start();
        let a = replica(server.port, "a", hourly(), restore).await;
        let b = replica(server.port, "b", hourly(), restore).await;
        if shapes {
            a.prepare_shapes().await.expect("shapes");
        }
        let epoch = installed(server.port, &a);
        assert_eq!(grant(&a, "s", 30).await, 30);
        assert_eq!(grant(&b, "s", 20).await, 20);
        assert_eq!(cli(server.port, &["SAVE"]), "OK");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(grant(&b, "s", 15).await, 15);
        server.stop();
        server.restart();
        assert_eq!(cli(server.port, &["GET", &epoch]), "0", "the save's epoch");
        if shapes {
            // A restart loses the functions with the keys' writes.
            a.prepare_shapes().await.expect("shapes");
        }

        let first = grant_once_back(&a, "s", 1).await;
        let rollbacks = a.keys().rollbacks();
        if !restore {
            assert_eq!(first, 1, "nothing found without restores");
            assert_eq!(grant(&a, "s", 100).await, 49, "50 more in the hour");
            continue;
        }
        assert_eq!(first, 0, "found and held (shapes: {shapes})");
        assert_eq!(
            grant_once_back(&b, "s", 1).await,
            0,
            "held for every replica"
        );
        let listed = cli(server.port, &["ZRANGE", &rollbacks, "0", "-1"]);
        assert!(listed.ends_with(" 0 *"), "one find of every hash: {listed}");
        let ra = a.watch_rollbacks().await;
        let rb = b.watch_rollbacks().await;
        assert_eq!(units_of(&ra), [(0, 0)], "a lost nothing");
        assert_eq!(units_of(&rb), [(30, 0)], "b's 15, per rule");
        assert!(b.watch_rollbacks().await.is_empty(), "each find once");
        tokio::time::sleep(BOUND).await;
        assert_eq!(grant(&a, "s", 100).await, 35, "what the hour had left");
        assert_eq!(grant(&b, "s", 1).await, 0, "used up");
        assert_eq!(
            cli(server.port, &["ZCARD", &rollbacks]),
            "1",
            "the same server: nobody finds it again"
        );
    }
}

/// Issue 52, item 3 (simulation seed 4992): a move of the server takes
/// the global rules' hash back too. Replica a grants seller s 30 and b
/// grants seller t 20 under a global 100 an hour; the save is taken; b
/// grants t 15 more. After the restart from the save, each replica writes
/// back, into the global hash as into its sellers', only what it was
/// granted after its own mark there: b its 15 (in t's hash and in the
/// global one), a nothing. So after the hold the fleet gets the 35 the
/// hour has left: not 50 (the global hash not written back), nor 15
/// (b's 20 from before the save counted twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_writes_back_the_global_rules_hash_after_each_replicas_mark() {
    let global = || {
        policy(
            vec![rule("fixed_window", 1_000, "1h", None)],
            vec![rule("fixed_window", 100, "1h", None)],
        )
    };
    let mut server = RedisServer::start();
    let a = replica(server.port, "a", global(), true).await;
    let b = replica(server.port, "b", global(), true).await;
    installed(server.port, &a);
    assert_eq!(grant(&a, "s", 30).await, 30);
    assert_eq!(grant(&b, "t", 20).await, 20);
    assert_eq!(cli(server.port, &["SAVE"]), "OK");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(grant(&b, "t", 15).await, 15);
    server.stop();
    server.restart();

    assert_eq!(grant_once_back(&a, "s", 1).await, 0, "found and held");
    assert_eq!(
        grant_once_back(&b, "t", 1).await,
        0,
        "held for every seller"
    );
    let ra = a.watch_rollbacks().await;
    let rb = b.watch_rollbacks().await;
    assert_eq!(units_of(&ra), [(0, 0)], "a lost nothing");
    assert_eq!(
        units_of(&rb),
        [(30, 0)],
        "b's 15 in t's hash and 15 in the global one"
    );
    tokio::time::sleep(BOUND).await;
    assert_eq!(
        grant(&a, "s", 100).await,
        35,
        "what the global hour had left"
    );
    assert_eq!(grant(&b, "t", 1).await, 0, "used up");
}

/// A store whose epoch is there but whose server key is not was left by
/// a version before the key (or with restores off), or it is a copy from
/// before the limiter's first call on this server (simulation seed 2973):
/// the calls that write the epoch write the key with it, so the two
/// cannot tell apart. It reads as a move: the first call is held for the
/// bound, once, and the seller goes on after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_without_the_server_key_reads_as_a_move_held_once() {
    let server = RedisServer::start();
    let a = replica(server.port, "a", hourly(), true).await;
    let epoch = a.keys().epoch(Topology::Single, "");
    cli(server.port, &["SET", &epoch, "0"]);
    assert_eq!(grant(&a, "s", 1).await, 0, "held: possibly an older copy");
    let listed = cli(server.port, &["ZRANGE", &a.keys().rollbacks(), "0", "-1"]);
    assert!(listed.ends_with(" 0 *"), "one find of every hash: {listed}");
    tokio::time::sleep(BOUND).await;
    assert_eq!(grant(&a, "s", 10).await, 10, "after the hold");
    assert_eq!(grant(&a, "s", 1).await, 1, "and no find again");

    // A first deploy (no epoch) writes the two together: no hold.
    cli(server.port, &["FLUSHALL"]);
    a.set_new_install(true);
    assert_eq!(grant(&a, "s", 1).await, 1, "a new install is not held");
    assert_ne!(cli(server.port, &["GET", &a.keys().server()]), "");
    a.set_new_install(false);
    assert_eq!(grant(&a, "s", 1).await, 1, "nor its next call");
}

/// A move of the server (here a restart that loads an older save) takes a
/// capped seller's slots back with everything else: the lease of a call
/// granted since the save is gone while the call may still be under way.
/// Every slot then counts as taken until a lease after the find, so
/// `max_in_flight` holds (fleet seed 169: two calls at once under a cap
/// of one, before). Without restores (no marks, no look at the server)
/// the slot is handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_sellers_slots_count_as_taken_for_a_lease_after_a_move() {
    let capped = || {
        let cfg = throttle_worker::config::LimitsConfig {
            default: vec![rule("fixed_window", 1_000, "1h", None)],
            sellers: [(
                "c".to_owned(),
                throttle_worker::config::SellerConfig {
                    unlimited: true,
                    max_in_flight: Some(1),
                    ..Default::default()
                },
            )]
            .into(),
            slot_lease: Duration::from_secs(3),
            ..Default::default()
        };
        Policy::from_config(&cfg).expect("a capped policy")
    };
    for restore in [true, false] {
        let mut server = RedisServer::start();
        let a = replica(server.port, "a", capped(), restore).await;
        let b = replica(server.port, "b", capped(), restore).await;
        installed(server.port, &a);
        // The server key is written by a first call, then saved.
        assert_eq!(grant(&b, "other", 1).await, 1);
        assert_eq!(cli(server.port, &["SAVE"]), "OK");
        assert_eq!(grant(&a, "c", 1).await, 1, "a's call takes the slot");
        assert_eq!(grant(&b, "c", 1).await, 0, "one at a time");
        server.stop();
        server.restart();
        let after = grant_once_back(&b, "c", 1).await;
        if restore {
            assert_eq!(after, 0, "a's call may still be under way");
            tokio::time::sleep(Duration::from_millis(3200)).await;
            assert_eq!(grant(&b, "c", 1).await, 1, "free a lease after the find");
        } else {
            assert_eq!(after, 1, "the slot handed out again");
        }
    }
}

/// Issue 52, item 1: a new install's first charging call asks the install
/// check first (the worker reads the group's commits again and commits
/// its start positions), once however many calls wait on it. Its "new"
/// lets the first calls through on an empty Redis; its "not new" (the
/// group committed since this replica started: another replica has
/// called, and Redis may have lost that) reads the missing state as a
/// loss; and a first call that Redis did not answer spends the "new":
/// Redis may lose its data before the next try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_installs_first_call_asks_the_install_check_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let check = |asked: &Arc<AtomicUsize>, new: bool| -> throttle_worker::limiter::InstallCheck {
        let asked = asked.clone();
        Arc::new(move || {
            let asked = asked.clone();
            Box::pin(async move {
                asked.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                if new {
                    Ok(())
                } else {
                    Err("the group has committed since".to_owned())
                }
            })
        })
    };
    let mut server = RedisServer::start();
    let asked = Arc::new(AtomicUsize::new(0));
    let a = replica(server.port, "a", hourly(), true).await;
    a.set_new_install(true);
    a.set_install_check(check(&asked, true));
    let (s, t) = tokio::join!(grant(&a, "s", 5), grant(&a, "t", 5));
    assert_eq!((s, t), (5, 5), "a new install: nobody waits");
    assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once");
    assert!(!a.new_install(), "the epoch is written");

    cli(server.port, &["FLUSHALL"]);
    let asked = Arc::new(AtomicUsize::new(0));
    let b = replica(server.port, "b", hourly(), true).await;
    b.set_new_install(true);
    b.set_install_check(check(&asked, false));
    assert_eq!(
        grant(&b, "s", 1).await,
        0,
        "not new: the empty state is a loss"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert!(!b.new_install());

    cli(server.port, &["FLUSHALL"]);
    let asked = Arc::new(AtomicUsize::new(0));
    let c = replica(server.port, "c", hourly(), true).await;
    c.set_new_install(true);
    c.set_install_check(check(&asked, true));
    server.stop();
    assert!(
        c.acquire_jobs("s", &[1]).await.is_err(),
        "Redis is down: no answer"
    );
    assert!(
        !c.new_install(),
        "the \"new\" is spent on the call that failed"
    );
    server.restart();
    assert_eq!(
        grant_once_back(&c, "s", 1).await,
        0,
        "Redis back empty: a loss, held"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // The check writes the epoch before it commits: a replica that then
    // reads the group as begun (not new) finds it, with the server key,
    // and is held by neither a loss nor a move.
    cli(server.port, &["FLUSHALL"]);
    let d = replica(server.port, "d", hourly(), true).await;
    assert!(once_back(|| d.begin_install()).await, "written");
    assert!(!d.begin_install().await.expect("Redis answers"), "once");
    let epoch = d.keys().epoch(Topology::Single, "");
    assert_eq!(cli(server.port, &["GET", &epoch]), "0", "never lost");
    let e = replica(server.port, "e", hourly(), true).await;
    assert_eq!(grant(&e, "s", 5).await, 5, "no loss, no move");
}
