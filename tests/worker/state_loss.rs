//! Redis loses its data under a running fleet (issue 33, item 2): it
//! restarts without persistence while one seller's backlog keeps its rule
//! saturated. Judged at the downstream, by the rule's own definition: with
//! `redis.on_state_loss = "wait"` (the default) the calls stay within the
//! rule across the loss; with `admit` (and in every release before the
//! guard) the lost state counts as fresh and a whole extra burst goes out.
//!
//! ```sh
//! cargo nextest run -E 'test(worker::state_loss::)' --no-capture
//! ```

use std::time::{Duration, Instant};

use crate::common::redis_server::RedisServer;
use crate::common::rule;
use crate::common::worker::{
    always_ok, job, policy, policy_with_free_probes, wait_all_calling, Bench, Downstream, Running,
};
use throttle_worker::config::OnStateLoss;
use throttle_worker::limiter::KeySpace;

/// `heavy`'s rule: GCRA, 10 per second with a burst of 20. Its backlog
/// keeps the bucket empty, so it is granted one job every 100 ms and asks
/// again every 100 ms: a loss at any moment is seen within 100 ms of Redis
/// answering again. The burst is large against what the outage itself
/// costs (about 10 units a second of it), so a fresh bucket shows. (A window algorithm would be asked again only when its
/// window ends, where a fresh state admits what the old one would have.)
const RATE: f64 = 10.0;
const BURST: f64 = 20.0;

/// Grant to arrival: calls go out as soon as granted, on loopback; a unit
/// of slack covers their jitter.
const SLACK_UNITS: f64 = 1.0;

struct Outcome {
    /// The most calls over the rule's bound in any interval, judged on
    /// arrival times: `n - (burst + rate * span)`.
    excess: f64,
    calls: usize,
    /// From the restart to the first call after it.
    first_after: Option<Duration>,
}

async fn lose_redis_under_a_backlog(on_loss: OnStateLoss) -> Outcome {
    let mut redis = RedisServer::start();
    let bench = Bench::new("state-loss", 4);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    settings.redis.on_state_loss = on_loss;
    let rules = || policy(vec![rule("gcra", RATE as u64, "1s", Some(BURST as u64))]);
    let records: Vec<_> = (0..150)
        .map(|i| job(&format!("heavy-{i}"), "heavy"))
        .collect();
    bench.produce(&records).await;
    let workers = [
        Running::start(settings.clone(), rules()),
        Running::start(settings, rules()),
    ];
    // Saturated: the bucket has been empty for a while.
    down.wait_for("heavy saturated", Duration::from_secs(60), |a| {
        a.len() >= 40
    })
    .await;
    redis.stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis.restart();
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for w in workers {
        w.stop().await;
    }
    let mut at: Vec<Instant> = down.arrivals().iter().map(|a| a.at).collect();
    at.sort();
    let mut excess = f64::MIN;
    for i in 0..at.len() {
        for j in i..at.len() {
            let span = (at[j] - at[i]).as_secs_f64();
            let n = (j - i + 1) as f64;
            excess = excess.max(n - (BURST + RATE * span));
        }
    }
    Outcome {
        excess,
        calls: at.len(),
        first_after: at.iter().find(|&&t| t > restarted).map(|&t| t - restarted),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_that_loses_its_data_lets_no_seller_past_its_limit() {
    let wait = lose_redis_under_a_backlog(OnStateLoss::Wait).await;
    println!(
        "wait: at most {:.1} calls over gcra 10/s burst 20 in any interval, {} calls, first after the restart {:?}",
        wait.excess, wait.calls, wait.first_after
    );
    let admit = lose_redis_under_a_backlog(OnStateLoss::Admit).await;
    println!(
        "admit: at most {:.1} calls over gcra 10/s burst 20 in any interval, {} calls, first after the restart {:?}",
        admit.excess, admit.calls, admit.first_after
    );
    assert!(
        wait.excess <= SLACK_UNITS,
        "on_state_loss = wait: {:.1} calls over the rule in one interval",
        wait.excess
    );
    // The judge has teeth: the same run reading the lost state as fresh
    // sends about a whole burst more than the rule allows.
    assert!(
        admit.excess > BURST / 2.0,
        "on_state_loss = admit: only {:.1} calls over the rule, expected about a burst ({BURST})",
        admit.excess
    );
}

/// The issue 52 run: two replicas, one seller streaming 20 jobs a second
/// under rules that never bind at that rate (gcra 200/s and 100,000 an
/// hour in a fixed window), on a Redis of the test's own that starts
/// empty (a first deploy) and restarts empty, down for 3 s, a third of
/// the way in.
struct Stream {
    /// From the first record produced to the first call.
    first_call: Option<Duration>,
    /// From Redis' return to the first call after it.
    resumed_after: Option<Duration>,
    produced: usize,
    /// Distinct jobs the downstream received.
    called: usize,
}

async fn stream_across_a_restart(state_loss_wait: Option<Duration>) -> Stream {
    let mut redis = RedisServer::start();
    let bench = Bench::new("state-loss-stream", 4);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    // The default on_state_loss (wait), on a first deploy.
    settings.redis.state_loss_wait = state_loss_wait;
    let rules = || {
        policy(vec![
            rule("gcra", 200, "1s", None),
            rule("fixed_window", 100_000, "1h", None),
        ])
    };
    let workers = [
        Running::start(settings.clone(), rules()),
        Running::start(settings, rules()),
    ];
    let (secs, per_second) = (45, 20);
    let mut produced = 0;
    let mut started = None;
    let mut restarted = None;
    for s in 0..secs {
        let batch: Vec<_> = (0..per_second)
            .map(|i| job(&format!("s{s}-{i}"), "stream"))
            .collect();
        bench.produce(&batch).await;
        started.get_or_insert_with(Instant::now);
        produced += batch.len();
        if s == secs / 3 {
            redis.stop();
            tokio::time::sleep(Duration::from_secs(3)).await;
            redis.restart();
            restarted = Some(Instant::now());
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    // Every job, once Redis lets them go.
    down.wait_distinct("every job", produced, Duration::from_secs(40))
        .await;
    for w in workers {
        w.stop().await;
    }
    let mut at: Vec<Instant> = down.arrivals().iter().map(|a| a.at).collect();
    at.sort();
    let distinct: std::collections::HashSet<String> =
        down.arrivals().into_iter().map(|a| a.job_id).collect();
    let (started, restarted) = (started.expect("produced"), restarted.expect("restarted"));
    Stream {
        first_call: at.first().map(|&t| t.saturating_duration_since(started)),
        resumed_after: at.iter().find(|&&t| t > restarted).map(|&t| t - restarted),
        produced,
        called: distinct.len(),
    }
}

/// Issue 52, items 1 and 4, judged at the downstream. A first deploy is
/// not a loss: the first job is called at once under the default `wait`
/// (before, the empty Redis read as a loss and the hourly rule held the
/// seller for the rest of its hour). A restart of Redis without its data
/// is a loss: the seller is held, and with `redis.state_loss_wait = "3s"`
/// for about that long, not the hour; every job is called.
///
/// ```sh
/// cargo nextest run -E 'test(worker::state_loss::a_first_deploy)' --no-capture
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_deploy_calls_at_once_and_a_bounded_wait_resumes_after_a_loss() {
    let bound = Duration::from_secs(3);
    let run = stream_across_a_restart(Some(bound)).await;
    println!(
        "state_loss_wait 3s: first call {:?} after the first record, calls resumed {:?} after Redis' return, {} of {} jobs called",
        run.first_call, run.resumed_after, run.called, run.produced
    );
    let first = run.first_call.expect("a call");
    assert!(
        first < Duration::from_secs(10),
        "a first deploy waited {first:?} for its first call (an hourly rule read the empty Redis as a loss)"
    );
    let resumed = run.resumed_after.expect("calls after Redis' return");
    // The guard held (a loss read as fresh resumes within a poll) ...
    assert!(
        resumed >= bound - Duration::from_millis(500),
        "calls resumed {resumed:?} after Redis lost its data: no hold"
    );
    // ... for about the bound, not the hourly rule's hour.
    assert!(
        resumed < bound + Duration::from_secs(10),
        "calls resumed only {resumed:?} after Redis' return (state_loss_wait {bound:?})"
    );
    assert_eq!(run.called, run.produced, "every job called");
}

/// How many calls the downstream took from a seller whose hour (a sliding
/// log of 60 an hour) three replicas used up before Redis restarted
/// empty, with `redis.state_loss_wait = "2s"` and `restore_bytes` for
/// each replica's grants.
async fn an_hour_used_up_across_a_restart(restore_bytes: usize) -> usize {
    const LIMIT: usize = 60;
    let mut redis = RedisServer::start();
    let bench = Bench::new("state-loss-restore", 6);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    settings.redis.state_loss_wait = Some(Duration::from_secs(2));
    settings.redis.restore_bytes = restore_bytes;
    let rules =
        || policy_with_free_probes(vec![rule("sliding_window_log", LIMIT as u64, "1h", None)]);
    let workers = [
        Running::start(settings.clone(), rules()),
        Running::start(settings.clone(), rules()),
        Running::start(settings, rules()),
    ];
    // Settled first: a grant whose partition moves before its call is
    // spent all the same, and the hour would end short of 60 calls.
    wait_all_calling(&bench, &down, 3, Duration::from_secs(60)).await;
    // Keyed by job: every replica's partitions hold some of them.
    let records: Vec<_> = (0..150).map(|i| job(&format!("h-{i}"), "hot")).collect();
    bench.produce(&records).await;
    down.wait_for("the hour used up", Duration::from_secs(60), |a| {
        a.iter().filter(|a| a.seller == "hot").count() >= LIMIT
    })
    .await;
    // Every replica has asked again and been told to wait the hour.
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart();
    // More of the seller's jobs come in after the return.
    let more: Vec<_> = (0..LIMIT).map(|i| job(&format!("m-{i}"), "hot")).collect();
    bench.produce(&more).await;
    // The hold (2 s from the first call after the return), then as long
    // again for whatever a fresh window would let through.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for w in workers {
        w.stop().await;
    }
    down.arrivals().iter().filter(|a| a.seller == "hot").count()
}

/// Issue 52, item 2, judged at the downstream: three replicas use up a
/// seller's hour, Redis restarts without its data, and with a bounded
/// wait of 2 s the seller gets nothing more within the hour: each replica
/// wrote back its own grants during the hold. The same run with no room
/// for grants (`restore_bytes = 0`, nothing restored) starts the hour
/// over for the replicas the new jobs reach (17 to 60 calls more, seen).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_restore_a_used_up_hour_after_redis_restarts_empty() {
    let restored = an_hour_used_up_across_a_restart(16 << 20).await;
    // Without restores the hour starts over only for the replicas the new
    // jobs reach that were not told to wait it (their own refusal): most
    // runs (77 to 120 seen), not every one (60 seen once in a full run).
    // Up to three tries, so that the judge's teeth show without a flake.
    let mut forgotten = 0;
    for _ in 0..3 {
        forgotten = an_hour_used_up_across_a_restart(0).await;
        if forgotten > 60 {
            break;
        }
    }
    println!(
        "sliding log 60/h, 3 replicas, Redis restarted empty, state_loss_wait 2s: {restored} calls with restores, {forgotten} without"
    );
    assert_eq!(restored, 60, "the hour held across the loss");
    // The judge has teeth: with nothing restored, the replicas whose own
    // refusal has not told them to wait (those the new jobs land on) get
    // a fresh hour.
    assert!(
        forgotten > 60,
        "without restores a fresh hour should let more than 60 through, got {forgotten}"
    );
}

/// How a seller's state goes back to an older copy.
#[derive(Debug, Clone, Copy)]
enum Rollback {
    /// Its key alone, `DUMP`ed and `RESTORE`d over it: the epoch and
    /// every other key stay.
    PutBack,
    /// Every key: Redis `SAVE`s, and is killed and restarted later, so it
    /// loads the older save (as a failover to a replica that missed the
    /// last writes does): the epoch, the marks and the handoff ledger go
    /// back with the state, under another run of the server.
    OlderSave,
}

/// How many calls the downstream took from a seller (a sliding log of 60
/// an hour, three replicas) whose state went back to a copy taken halfway
/// through its hour (`how`), with `restore_bytes` for each replica's
/// grants and marks. 60 more of its jobs arrive after.
async fn an_hour_used_up_across_a_rollback(how: Rollback, restore_bytes: usize) -> usize {
    const LIMIT: usize = 60;
    let mut redis = RedisServer::start();
    let bench = Bench::new("state-rollback", 6);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.redis.url = redis.url();
    settings.redis.state_loss_wait = Some(Duration::from_secs(2));
    settings.redis.restore_bytes = restore_bytes;
    let key = KeySpace::new(settings.redis.key_prefix.clone()).seller_state("hot");
    let rules =
        || policy_with_free_probes(vec![rule("sliding_window_log", LIMIT as u64, "1h", None)]);
    let workers = [
        Running::start(settings.clone(), rules()),
        Running::start(settings.clone(), rules()),
        Running::start(settings, rules()),
    ];
    wait_all_calling(&bench, &down, 3, Duration::from_secs(60)).await;
    let hot = |down: &Downstream| down.arrivals().iter().filter(|a| a.seller == "hot").count();
    // Half the hour, then the copy, then the other half: keyed by job, so
    // every replica's partitions hold some of each half.
    let first: Vec<_> = (0..LIMIT / 2)
        .map(|i| job(&format!("a-{i}"), "hot"))
        .collect();
    bench.produce(&first).await;
    down.wait_for("half the hour", Duration::from_secs(60), |a| {
        a.iter().filter(|a| a.seller == "hot").count() >= LIMIT / 2
    })
    .await;
    let mut c = redis::Client::open(redis.url())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("the private redis-server");
    let copy: Vec<u8> = match how {
        Rollback::PutBack => redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut c)
            .await
            .expect("DUMP"),
        Rollback::OlderSave => {
            let () = redis::cmd("SAVE").query_async(&mut c).await.expect("SAVE");
            Vec::new()
        }
    };
    let second: Vec<_> = (0..LIMIT / 2)
        .map(|i| job(&format!("b-{i}"), "hot"))
        .collect();
    bench.produce(&second).await;
    down.wait_for("the hour used up", Duration::from_secs(60), |a| {
        a.iter().filter(|a| a.seller == "hot").count() >= LIMIT
    })
    .await;
    match how {
        Rollback::PutBack => {
            let () = redis::cmd("RESTORE")
                .arg(&key)
                .arg(0)
                .arg(copy.as_slice())
                .arg("REPLACE")
                .query_async(&mut c)
                .await
                .expect("RESTORE");
        }
        Rollback::OlderSave => {
            redis.stop();
            redis.restart();
        }
    }
    let before = hot(&down);
    let more: Vec<_> = (0..LIMIT).map(|i| job(&format!("m-{i}"), "hot")).collect();
    bench.produce(&more).await;
    // The hold (2 s from the find), then as long again for whatever the
    // older copy would let through.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for w in workers {
        w.stop().await;
    }
    let after = hot(&down);
    println!("rollback run ({how:?}, restore_bytes {restore_bytes}): {before} calls before the state went back, {after} in all");
    after
}

/// Issue 52, item 3, judged at the downstream: a seller's key goes back
/// to a copy taken halfway through its hour while the epoch stays. Each
/// replica's next call carries its last grant there, finds the state
/// behind it and holds the seller; every replica writes back what the
/// copy lost, and the seller gets nothing more within the hour. With no
/// room for grants (`restore_bytes = 0`, no marks), the older copy lets
/// the second half of the hour through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_find_a_seller_key_put_back_from_an_older_copy() {
    let kept = an_hour_used_up_across_a_rollback(Rollback::PutBack, 16 << 20).await;
    let forgotten = an_hour_used_up_across_a_rollback(Rollback::PutBack, 0).await;
    println!(
        "sliding log 60/h, 3 replicas, the seller's key put back to its copy at 30: {kept} calls with marks, {forgotten} without"
    );
    assert_eq!(kept, 60, "the hour held across the rollback");
    assert!(
        forgotten > 60,
        "without marks the older copy should let more than 60 through, got {forgotten}"
    );
}

/// Issue 52, item 3, judged at the downstream: Redis restarts and loads a
/// save taken halfway through the seller's hour, so every key goes back
/// together, the replicas' marks and the epoch with the state (a failover
/// to a replica that missed the last writes does the same). Whichever
/// replica calls first finds the server moved (its run id), the fleet
/// holds every seller and writes back what the save lost, and the seller
/// gets nothing more within the hour. Without restores (no marks, no look
/// at the server) the older save lets the second half through again.
/// Here every replica lost grants to the save, so the marks alone also
/// find it (checked: 60 with the look at the server turned off); the case
/// only the server's run id catches, a replica that lost nothing calling
/// first, is pinned by `tests/limiter/restore.rs`
/// (`a_restart_that_loads_an_older_save_holds_even_a_replica_that_lost_nothing`)
/// and by the simulation's failovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_hold_a_seller_across_a_restart_that_loads_an_older_save() {
    let kept = an_hour_used_up_across_a_rollback(Rollback::OlderSave, 16 << 20).await;
    let forgotten = an_hour_used_up_across_a_rollback(Rollback::OlderSave, 0).await;
    println!(
        "sliding log 60/h, 3 replicas, Redis restarted from its save at 30: {kept} calls with restores, {forgotten} without"
    );
    assert_eq!(kept, 60, "the hour held across the older save");
    assert!(
        forgotten > 60,
        "without restores the older save should let more than 60 through, got {forgotten}"
    );
}
