//! The worker as operators run it: processes of the binary against a
//! `dev-broker` process, real Redis and an in-test downstream — a kill -9
//! mid-run (issue test 7) and a SIGTERM under load (issue test 9) — and
//! replicas joining and leaving a running group (issue test 8, in process).
//! Each test prints the figures it measures (`--nocapture` to see them):
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo test --test worker worker::processes:: -- --nocapture
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use crate::common::procs::{
    by_job, committed_offsets, end_offsets, start_worker, start_worker_env, wait_committed_to_end,
    wait_settled, BrokerProc, LogEvent, Names, Proc, Scratch, TaggedDownstream,
};
use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, produce, Bench, Downstream, Running};
use throttle_worker::telemetry::metrics::metrics;

// These tests time the worker: each runs alone on the machine
// (`threads-required` in .config/nextest.toml), not beside another test.

/// Every seller's limit: 10 per second after a burst of 5, so 75 jobs of a
/// seller take about 7 s however many workers share them, and a run lasts
/// long enough to kill, stop or add a worker in the middle of it.
const RULES_TOML: &str = r#"[{ algorithm = "gcra", limit = 10, period = "1s", burst = 5 }]"#;

/// The default `downstream.concurrency` (config/default.toml).
const DOWNSTREAM_CONCURRENCY: usize = 64;

/// Kafka records as `produce` takes them: (key, value).
type Records = Vec<(Option<String>, Vec<u8>)>;

/// `per_seller` jobs for each of `sellers` sellers, interleaved, with ids
/// `<tag>-<seller>-<i>`; each record keyed by a random product, so one
/// seller's jobs spread over every partition.
fn jobs(tag: &str, sellers: usize, per_seller: usize) -> (Vec<String>, Records) {
    let mut ids = Vec::new();
    let mut records = Vec::new();
    for i in 0..per_seller {
        for s in 0..sellers {
            let id = format!("{tag}-{s}-{i}");
            records.push(job(&id, &format!("seller-{s}")));
            ids.push(id);
        }
    }
    (ids, records)
}

fn ms_between(later: SystemTime, earlier: SystemTime) -> i128 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_millis() as i128,
        Err(e) => -(e.duration().as_millis() as i128),
    }
}

/// Issue test 7: three worker processes; one is killed with SIGKILL after a
/// third of the jobs arrived. Every job still reaches the downstream, and
/// only jobs the group had not committed are delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_one_of_three_worker_processes_loses_no_job() {
    const PARTITIONS: i32 = 6;
    let dir = Scratch::new("crash");
    let n = Names::new("crash");
    let broker = BrokerProc::start(dir.path(), &n.topics(PARTITIONS));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = n
        .config(&broker.bootstrap, RULES_TOML, "5s")
        .write(dir.path(), "worker");
    let names = ["w0", "w1", "w2"];
    let mut workers: Vec<Proc> = names
        .iter()
        .map(|w| start_worker(dir.path(), w, &config, &down.url(w)))
        .collect();
    // Produce only once the group has settled, so that the kill is the only
    // rebalance during the run and every duplicate is the kill's.
    let held = wait_settled(
        &workers.iter().collect::<Vec<_>>(),
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(30),
    )
    .await;
    let (ids, records) = jobs("crash", 20, 75);
    let produced = produce(&broker.bootstrap, &n.jobs, &records).await;
    let started = Instant::now();
    down.wait_distinct(
        "a third of the jobs, before the kill",
        ids.len() / 3,
        Duration::from_secs(30),
    )
    .await;
    let committed_before = committed_offsets(
        &broker.bootstrap,
        &n.group,
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(5),
    )
    .await;
    let victim = 1;
    let killed_at = SystemTime::now();
    let killed_after = started.elapsed();
    let arrived_at_kill = down.distinct();
    workers[victim].kill9();
    down.wait_distinct(
        "every job, after the kill",
        ids.len(),
        Duration::from_secs(45),
    )
    .await;
    let end = end_offsets(&produced);
    wait_committed_to_end(
        &broker.bootstrap,
        &n.group,
        &n.jobs,
        &end,
        Duration::from_secs(20),
    )
    .await;
    let run_time = started.elapsed();

    // When the survivors got their partitions after the kill: the last
    // "partitions assigned" either logged after it.
    let reassigned_at = workers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .flat_map(|(_, w)| w.log_events())
        .filter(|e: &LogEvent| e.message == "partitions assigned" && e.at > killed_at)
        .map(|e| e.at)
        .max()
        .expect("the survivors were assigned partitions after the kill");

    let arrivals = down.arrivals();
    let per_job = by_job(&arrivals);
    let missing: Vec<&String> = ids.iter().filter(|id| !per_job.contains_key(*id)).collect();
    assert!(missing.is_empty(), "jobs lost: {missing:?}");
    let position: HashMap<&str, (i32, i64)> = ids
        .iter()
        .map(String::as_str)
        .zip(produced.iter().copied())
        .collect();
    let committed = |p: i32| committed_before.get(&p).copied().flatten().unwrap_or(0);

    // Which jobs may be delivered twice. A record is fetched again only by
    // a new assignment of its partition, which starts at the group's
    // committed offset. Committed offsets only grow, so a redelivered job
    // sits at or above the offset committed just before the kill. And its
    // first delivery happened before its partition moved: by the killed
    // worker before the kill, or by a survivor before the rebalance that
    // followed (the classic protocol revokes *every* partition, and a
    // survivor that gets one back restarts it at the committed offset too).
    // "Before" is judged by the first call's grant (X-Granted-At, Redis'
    // clock, which reads the same host clock as the workers' logs): a call
    // still in flight when the partitions moved was granted before, however
    // late it reached the downstream, so no slack is needed.
    //
    // Why not "downstream.concurrency plus the granted batches"? Offsets are
    // committed as the contiguous finished prefix of a partition, and one
    // partition interleaves all 20 sellers: while one seller waits for a
    // permit, jobs of the others at higher offsets finish but cannot be
    // committed past it. At the kill, every finished job above its
    // partition's first unfinished offset is redone. That number grows
    // with the spread between sellers' progress, not with the calls in
    // flight, so it is the bound this test can defend.
    let horizon = crate::common::unix_us(reassigned_at);
    let mut first_grant: HashMap<&str, u64> = HashMap::new();
    for (_, a) in &arrivals {
        let granted = a
            .granted_at_us
            .unwrap_or_else(|| panic!("{}: a call without X-Granted-At", a.job_id));
        let first = first_grant.entry(a.job_id.as_str()).or_insert(granted);
        *first = (*first).min(granted);
    }
    let may_repeat: HashSet<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| {
            let (p, o) = position[id];
            o >= committed(p) && first_grant[id] < horizon
        })
        .collect();
    let duplicated: Vec<(&str, &Vec<(String, SystemTime)>)> = per_job
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let extra_calls: usize = duplicated.iter().map(|(_, v)| v.len() - 1).sum();
    // Every partition event of every worker, in ms relative to the kill:
    // an unexpected rebalance (a missed heartbeat) shows up here.
    let rebalances: Vec<(&str, &str, i128)> = names
        .iter()
        .zip(&workers)
        .flat_map(|(name, w)| {
            w.log_events()
                .into_iter()
                .filter(|e| e.message == "partitions assigned" || e.message == "partitions revoked")
                .map(move |e| {
                    let what = if e.message == "partitions assigned" {
                        "assigned"
                    } else {
                        "revoked"
                    };
                    (*name, what, ms_between(e.at, killed_at))
                })
        })
        .collect();
    for (id, calls) in &duplicated {
        let (p, o) = position[id];
        assert!(
            may_repeat.contains(id),
            "{id} (partition {p}, offset {o}; committed before the kill: {}) was delivered {} times: {:?} (worker, ms after the kill); \
             the rebalance ended {} ms after the kill; partition events (worker, event, ms after the kill): {rebalances:?}",
            committed(p),
            calls.len(),
            calls
                .iter()
                .map(|(w, at)| (w.as_str(), ms_between(*at, killed_at)))
                .collect::<Vec<_>>(),
            ms_between(reassigned_at, killed_at),
        );
    }
    let victim_tag = names[victim];
    let victim_uncommitted = ids
        .iter()
        .filter(|id| {
            let (p, o) = position[id.as_str()];
            let first = &per_job[id.as_str()][0];
            first.0 == victim_tag && o >= committed(p)
        })
        .count();
    // Why each duplicate was redone. For each partition, the moment its
    // owner stopped working on it (the kill for the victim's, the
    // survivor's first revocation after the kill for the others') and the
    // contiguous prefix delivered by then: a duplicate below that prefix
    // was finished in order but its offset never committed (since the last
    // periodic commit, or because the commit on revoke was refused: the
    // mock refuses every commit while the group is joining); one above it
    // was finished past a job still waiting for its permit.
    let mut stopped_at: HashMap<i32, SystemTime> = HashMap::new();
    for (w, parts) in held.iter().enumerate() {
        let at = if w == victim {
            killed_at
        } else {
            workers[w]
                .log_events()
                .into_iter()
                .find(|e| e.message == "partitions revoked" && e.at > killed_at)
                .map_or(reassigned_at, |e| e.at)
        };
        for p in parts {
            stopped_at.insert(*p, at);
        }
    }
    let mut by_position: BTreeMap<(i32, i64), &str> = BTreeMap::new();
    for (id, pos) in &position {
        by_position.insert(*pos, id);
    }
    let prefix_end = |p: i32| {
        let mut o = committed(p);
        while let Some(id) = by_position.get(&(p, o)) {
            if per_job[*id][0].1 >= stopped_at[&p] {
                break;
            }
            o += 1;
        }
        o
    };
    let prefix: HashMap<i32, i64> = (0..PARTITIONS).map(|p| (p, prefix_end(p))).collect();
    let in_prefix = duplicated
        .iter()
        .filter(|(id, _)| {
            let (p, o) = position[id];
            o < prefix[&p]
        })
        .count();
    let most_calls = duplicated.iter().map(|(_, v)| v.len()).max().unwrap_or(1);
    let first_by_victim = duplicated
        .iter()
        .filter(|(_, v)| v[0].0 == victim_tag)
        .count();
    eprintln!(
        "crash: {} jobs, 3 worker processes holding {held:?} of {PARTITIONS} partitions; kill -9 of {victim_tag} after {killed_after:?} with {arrived_at_kill} jobs arrived; \
         rebalance done {} ms after the kill; all jobs arrived and committed after {run_time:?}",
        ids.len(),
        ms_between(reassigned_at, killed_at),
    );
    eprintln!(
        "crash: duplicates per kill: {extra_calls} extra calls over {} jobs (at most {most_calls} calls for one job; {first_by_victim} first delivered by the killed worker, {} by survivors); \
         bound (finished above the committed offset before the partitions moved): {}; the killed worker's own finished-but-uncommitted jobs: {victim_uncommitted}; \
         downstream.concurrency: {DOWNSTREAM_CONCURRENCY}",
        duplicated.len(),
        duplicated.len() - first_by_victim,
        may_repeat.len(),
    );
    eprintln!(
        "crash: of the {} duplicated jobs, {in_prefix} were in their partition's finished prefix but not committed, {} were finished above a job still waiting; \
         committed before the kill {committed_before:?}, finished prefix when each owner stopped {prefix:?}",
        duplicated.len(),
        duplicated.len() - in_prefix,
    );
}

/// Issue 53, item 2: one of three worker processes stopped (SIGSTOP) for
/// 8 s, past the session timeout (3 s): the group gives its partitions to
/// the others meanwhile. When it resumes it still holds its jobs and their
/// grants, and believes it owns their partitions: it must fence itself
/// (its watchdog saw the gap) and call nothing until a rebalance or a
/// commit confirms it. A call that was already past its check when the
/// process stopped may still arrive (nothing in a process can see that
/// stall): such a call was granted before the stop. No job is lost.
///
/// What it cannot show: librdkafka checks its own session timeout on
/// resuming and revokes the assignment within milliseconds, so here no
/// call slipped into that window even with the fence disabled (measured
/// twice: 0 calls, as with it). The window is the engine's, and the
/// simulation's `a_fenced_replica_calls_nothing_until_its_ownership_is_confirmed`
/// is the test that fails without the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_resumes_fenced_and_calls_nothing_before_it_is_confirmed() {
    const PARTITIONS: i32 = 6;
    let dir = Scratch::new("stall");
    let n = Names::new("stall");
    let broker = BrokerProc::start(dir.path(), &n.topics(PARTITIONS));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = n
        .config(&broker.bootstrap, RULES_TOML, "5s")
        .write(dir.path(), "worker");
    let names = ["w0", "w1", "w2"];
    let workers: Vec<Proc> = names
        .iter()
        .map(|w| start_worker(dir.path(), w, &config, &down.url(w)))
        .collect();
    wait_settled(
        &workers.iter().collect::<Vec<_>>(),
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(30),
    )
    .await;
    let (ids, records) = jobs("stall", 20, 75);
    produce(&broker.bootstrap, &n.jobs, &records).await;
    down.wait_distinct(
        "a third of the jobs, before the stop",
        ids.len() / 3,
        Duration::from_secs(30),
    )
    .await;
    let victim = 1;
    let victim_tag = names[victim];
    workers[victim].sigstop();
    let stopped_at = SystemTime::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let continued_at = SystemTime::now();
    workers[victim].sigcont();
    down.wait_distinct(
        "every job, after the stall",
        ids.len(),
        Duration::from_secs(60),
    )
    .await;
    // It rejoins the group after the others took its partitions: its fence
    // ends with that assignment (the mock holds a rebalance ~2 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline
        && !workers[victim]
            .log_events()
            .iter()
            .any(|e| e.message.starts_with("consumer resumed") && e.at >= stopped_at)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let events = workers[victim].log_events();
    let fenced = events
        .iter()
        .find(|e| e.message.starts_with("consumer fenced") && e.at >= stopped_at)
        .unwrap_or_else(|| panic!("{victim_tag} never fenced itself after the stop"));
    let resumed = events
        .iter()
        .find(|e| e.message.starts_with("consumer resumed") && e.at >= fenced.at)
        .unwrap_or_else(|| panic!("{victim_tag} fenced at {:?} and never resumed", fenced.at));
    let stop_us = crate::common::unix_us(stopped_at);
    let arrivals = down.arrivals();
    // The stopped worker's calls from its continuation to its resume.
    let fenced_calls: Vec<(&str, Option<u64>)> = arrivals
        .iter()
        .filter(|(tag, a)| tag == victim_tag && a.wall > continued_at && a.wall < resumed.at)
        .map(|(_, a)| (a.job_id.as_str(), a.granted_at_us))
        .collect();
    let granted_after_stop: Vec<&(&str, Option<u64>)> = fenced_calls
        .iter()
        .filter(|(_, g)| g.is_none_or(|g| g >= stop_us))
        .collect();
    assert!(
        granted_after_stop.is_empty(),
        "{victim_tag} called jobs granted after its stop before it resumed: {granted_after_stop:?}"
    );
    let per_job = by_job(&arrivals);
    let missing: Vec<&String> = ids.iter().filter(|id| !per_job.contains_key(*id)).collect();
    assert!(missing.is_empty(), "jobs lost: {missing:?}");
    let twice = per_job.values().filter(|v| v.len() > 1).count();
    let field =
        |e: &LogEvent, k: &str| e.fields.get(k).map(ToString::to_string).unwrap_or_default();
    eprintln!(
        "stall: {victim_tag} stopped 8 s (session 3 s); fenced {} ms after SIGCONT (reason {}, gap {} ms), resumed by {} after {} ms; \
         {} calls of it arrived meanwhile (all granted before the stop); {twice} of {} jobs called twice",
        ms_between(fenced.at, continued_at),
        field(fenced, "reason"),
        field(fenced, "gap_ms"),
        field(resumed, "by"),
        field(resumed, "fenced_ms"),
        fenced_calls.len(),
        ids.len(),
    );
}

/// Issue test 9: SIGTERM to a worker process under load: it exits 0 within
/// `worker.shutdown_timeout` plus a margin, and its committed offsets are
/// exactly as far as its finished jobs allow: every job below the committed
/// offset reached the downstream, the job at it did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_0_and_commits_every_finished_job() {
    stop_under_load("SIGTERM", Proc::sigterm).await;
}

/// Ctrl-C (SIGINT) stops a worker as SIGTERM does: the same checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_under_load_exits_0_and_commits_every_finished_job() {
    stop_under_load("SIGINT", Proc::sigint).await;
}

/// The signal `name` (sent by `send`) to a worker process with calls in
/// flight and jobs waiting; see the two tests above.
async fn stop_under_load(name: &str, send: fn(&Proc)) {
    const PARTITIONS: i32 = 4;
    let shutdown_timeout = Duration::from_secs(5);
    let margin = Duration::from_secs(5);
    let dir = Scratch::new("shutdown");
    let n = Names::new("shutdown");
    let broker = BrokerProc::start(dir.path(), &n.topics(PARTITIONS));
    // Every call takes 100 ms, so calls are in flight when the signal comes.
    let down = TaggedDownstream::start(Duration::from_millis(100)).await;
    let config = n
        .config(&broker.bootstrap, RULES_TOML, "5s")
        .write(dir.path(), "worker");
    let mut worker = start_worker(dir.path(), "w0", &config, &down.url("w0"));
    wait_settled(&[&worker], &n.jobs, PARTITIONS, Duration::from_secs(30)).await;
    let (ids, records) = jobs("term", 20, 50);
    let produced = produce(&broker.bootstrap, &n.jobs, &records).await;
    down.wait_distinct(
        &format!("a fifth of the jobs, before {name}"),
        ids.len() / 5,
        Duration::from_secs(30),
    )
    .await;
    let term = Instant::now();
    send(&worker);
    let status = worker
        .wait_exit(
            &format!("the worker to exit after {name}"),
            shutdown_timeout + margin,
        )
        .await;
    let exit_after = term.elapsed();
    assert!(
        status.success(),
        "the worker must exit 0 after {name}, got {status}"
    );
    assert!(
        exit_after <= shutdown_timeout + margin,
        "exit took {exit_after:?}, shutdown_timeout {shutdown_timeout:?} + {margin:?}"
    );
    let summary = worker
        .log_events()
        .into_iter()
        .find(|e| e.message == "worker stopped")
        .and_then(|e| e.field("summary").map(str::to_owned))
        .unwrap_or_else(|| "(no \"worker stopped\" line)".to_owned());

    let committed = committed_offsets(
        &broker.bootstrap,
        &n.group,
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(5),
    )
    .await;
    let arrived: HashSet<String> = down.arrivals().into_iter().map(|(_, a)| a.job_id).collect();
    let mut at: BTreeMap<(i32, i64), &str> = BTreeMap::new();
    for (id, pos) in ids.iter().zip(produced.iter()) {
        at.insert(*pos, id);
    }
    let end = end_offsets(&produced);
    let (mut below, mut above_done, mut left) = (0, 0, 0);
    for (&p, &e) in &end {
        let c = committed.get(&p).copied().flatten().unwrap_or(0);
        for o in 0..e {
            let id = at[&(p, o)];
            let done = arrived.contains(id);
            if o < c {
                assert!(
                    done,
                    "partition {p}: {id} at offset {o} is below the committed offset {c} but never reached the downstream (lost)"
                );
                below += 1;
            } else if o == c {
                assert!(
                    !done,
                    "partition {p}: {id} at the committed offset {c} reached the downstream: the commit stopped short of the finished prefix"
                );
            } else if done {
                above_done += 1;
            }
            if o >= c {
                left += 1;
            }
        }
    }
    eprintln!(
        "shutdown: {name} after {} of {} jobs arrived; exit status {status} after {exit_after:?} (shutdown_timeout {shutdown_timeout:?}); {summary}",
        arrived.len(),
        ids.len()
    );
    eprintln!(
        "shutdown: committed {committed:?} of ends {end:?}: {below} jobs below the committed offsets, all arrived; \
         {left} left to the next owner, of which {above_done} already arrived (finished above a waiting job: named in the commit metadata, so the next owner skips them)"
    );
    assert!(
        below > 0,
        "nothing was committed: the check above proves nothing"
    );
    assert!(left > 0, "the run finished before {name}: not under load");
}

/// Issue test 8: two workers start, a third joins mid-run, then the first
/// leaves gracefully. Nothing is lost; the joining worker is given
/// partitions and calls their jobs; the leaver calls nothing after it
/// stopped, and its partitions' jobs are called by the others. Repeats are
/// held to what at-least-once promises: a job is fetched again only by a
/// new assignment of its partition, so it is called at most once more than
/// the assignments made after its first call (every assignment is counted,
/// `throttle_rebalances_total`, watched every 5 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_joins_and_another_leaves_mid_run_and_no_job_is_lost() {
    const PARTITIONS: i32 = 6;
    let bench = Bench::new("rebalance", PARTITIONS);
    let down = Downstream::start(always_ok()).await;
    // Each worker calls `{url}?w=NAME`, so every arrival names its worker.
    let url = |name: &str| format!("{}?w={name}", down.url);
    let rules = || policy(vec![rule("gcra", 10, "1s", Some(5))]);
    // (when, assignments so far) at each change of the process' count of
    // assignments: only this test's in-process workers add to it.
    let assignments: std::sync::Arc<std::sync::Mutex<Vec<(Instant, u64)>>> = std::sync::Arc::new(
        std::sync::Mutex::new(vec![(Instant::now(), metrics().rebalances.get())]),
    );
    let watcher = {
        let assignments = assignments.clone();
        tokio::spawn(async move {
            loop {
                let now = metrics().rebalances.get();
                {
                    let mut a = assignments.lock().unwrap();
                    if a.last().is_none_or(|(_, n)| *n != now) {
                        a.push((Instant::now(), now));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (ids, records) = jobs("reb", 20, 75);
    let produced = bench.produce(&records).await;
    let distinct = |down: &Downstream| {
        down.arrivals()
            .into_iter()
            .map(|a| a.job_id)
            .collect::<HashSet<_>>()
            .len()
    };
    let started = Instant::now();
    let first = Running::start(bench.settings(&url("first")), rules());
    let second = Running::start(bench.settings(&url("second")), rules());
    let quarter = ids.len() / 4;
    down.wait_for(
        "a quarter of the jobs, before the join",
        Duration::from_secs(30),
        |a| {
            a.iter()
                .map(|x| x.job_id.as_str())
                .collect::<HashSet<_>>()
                .len()
                >= quarter
        },
    )
    .await;
    let third = Running::start(bench.settings(&url("third")), rules());
    let (joined_after, at_join) = (started.elapsed(), distinct(&down));
    let half = ids.len() / 2;
    down.wait_for(
        "half of the jobs, before the leave",
        Duration::from_secs(30),
        |a| {
            a.iter()
                .map(|x| x.job_id.as_str())
                .collect::<HashSet<_>>()
                .len()
                >= half
        },
    )
    .await;
    let (left_after, at_leave) = (started.elapsed(), distinct(&down));
    let left = first.stop().await;
    let left_at = Instant::now();
    let all: HashSet<&str> = ids.iter().map(String::as_str).collect();
    down.wait_for("every job, after the leave", Duration::from_secs(45), |a| {
        a.iter()
            .map(|x| x.job_id.as_str())
            .collect::<HashSet<_>>()
            .len()
            >= all.len()
    })
    .await;
    let end = end_offsets(&produced);
    wait_committed_to_end(
        &bench.bootstrap(),
        &bench.group,
        &bench.topics.jobs,
        &end,
        Duration::from_secs(20),
    )
    .await;
    let run_time = started.elapsed();
    let (s2, s3) = (second.stop().await, third.stop().await);
    watcher.abort();
    let assignments = assignments.lock().unwrap().clone();

    let arrivals = down.arrivals();
    let position: HashMap<&str, (i32, i64)> = ids
        .iter()
        .map(String::as_str)
        .zip(produced.iter().copied())
        .collect();
    let mut calls: HashMap<&str, Vec<Instant>> = HashMap::new();
    for a in &arrivals {
        calls.entry(a.job_id.as_str()).or_default().push(a.at);
    }
    let missing: Vec<&&str> = all.iter().filter(|id| !calls.contains_key(**id)).collect();
    assert!(missing.is_empty(), "jobs lost: {missing:?}");
    let strangers: Vec<&&str> = calls.keys().filter(|id| !all.contains(**id)).collect();
    assert!(strangers.is_empty(), "unknown jobs arrived: {strangers:?}");
    let partitions_of = |worker: &str| -> std::collections::BTreeSet<i32> {
        arrivals
            .iter()
            .filter(|a| a.via == format!("w={worker}"))
            .map(|a| position[a.job_id.as_str()].0)
            .collect()
    };
    let held: Vec<(&str, std::collections::BTreeSet<i32>)> = ["first", "second", "third"]
        .into_iter()
        .map(|w| (w, partitions_of(w)))
        .collect();
    assert!(
        !held[2].1.is_empty(),
        "the joining worker was given no partition (or called none of its jobs): {held:?}"
    );
    let leaver_late: Vec<&str> = arrivals
        .iter()
        .filter(|a| a.via == "w=first" && a.at > left_at)
        .map(|a| a.job_id.as_str())
        .collect();
    assert!(
        leaver_late.is_empty(),
        "the worker that left called jobs after it stopped: {leaver_late:?}"
    );
    // Each repeat needs an assignment after the job's first call.
    let assignments_after = |t: Instant| {
        let before = assignments
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map_or(0, |(_, n)| *n);
        assignments.last().map_or(0, |(_, n)| *n) - before
    };
    let mut extra = 0;
    let mut duplicated = 0;
    for (id, times) in &mut calls {
        times.sort();
        if times.len() < 2 {
            continue;
        }
        duplicated += 1;
        extra += times.len() - 1;
        let after = assignments_after(times[0]);
        assert!(
            (times.len() - 1) as u64 <= after,
            "{id} (partition, offset {:?}) was called {} times, but only {after} assignments followed its first call ({:?} after the start)",
            position[*id],
            times.len(),
            times[0] - started
        );
    }
    eprintln!(
        "rebalance: {} jobs; third worker joined after {joined_after:?} ({at_join} arrived), first left after {left_after:?} ({at_leave} arrived); \
         all arrived and committed after {run_time:?}; partitions each worker called jobs of: {held:?}; {} assignments in all",
        ids.len(),
        assignments.last().map_or(0, |(_, n)| *n) - assignments[0].1
    );
    eprintln!(
        "rebalance: duplicates: {extra} extra calls over {duplicated} jobs; summaries: leaver {left:?}, others {s2:?} {s3:?}"
    );
    assert_eq!(
        left.abandoned, 0,
        "the leaving worker abandoned in-flight work"
    );
}

/// Waits until no worker has logged an assignment or a revocation for
/// `quiet`: the group has settled for every consumer of every replica.
async fn wait_quiet(workers: &[Proc], quiet: Duration, timeout: Duration) {
    let count = || -> usize {
        workers
            .iter()
            .map(|w| {
                w.log_events()
                    .iter()
                    .filter(|e| e.message.starts_with("partitions "))
                    .count()
            })
            .sum()
    };
    let deadline = Instant::now() + timeout;
    let (mut seen, mut since) = (count(), Instant::now());
    while since.elapsed() < quiet {
        assert!(
            Instant::now() < deadline,
            "the group kept rebalancing for {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = count();
        if now != seen {
            (seen, since) = (now, Instant::now());
        }
    }
}

/// Rewrites a worker config's consumer properties for one membership
/// protocol: `eager` (`range`), `kip848` (`group.protocol = consumer`, which
/// takes no session or heartbeat settings from the client), anything else
/// the default (cooperative-sticky).
fn with_membership(config: &std::path::Path, membership: &str) {
    let text = std::fs::read_to_string(config).expect("read worker config");
    let text = match membership {
        "eager" => text.replace(
            "[kafka.consumer_properties]\n",
            "[kafka.consumer_properties]\n\"partition.assignment.strategy\" = \"range\"\n",
        ),
        "kip848" => text
            .replace("\"session.timeout.ms\" = \"3000\"\n", "")
            .replace(
                "\"heartbeat.interval.ms\" = \"300\"\n",
                "\"group.protocol\" = \"consumer\"\n",
            ),
        _ => text,
    };
    std::fs::write(config, text).expect("write worker config");
}

/// Every seller's limit in the crash loop: a sliding log, so "over its
/// limit" has one meaning (more than 20 calls in some second).
const CRASH_LOOP_LIMIT: usize = 20;
const CRASH_LOOP_RULES: &str =
    r#"[{ algorithm = "sliding_window_log", limit = 20, period = "1s" }]"#;

/// Issue 6, crash loop: four worker processes; every few seconds a random
/// one is killed with SIGKILL and started again. Nothing is lost, no seller
/// is ever over its limit at the downstream, and a job is repeated only
/// from at or above an offset its partition had not committed before the
/// job was first called (every repeat is work finished since the last
/// commit). CI runs 4,000 jobs with a kill every 6 s; the issue's run:
///
/// ```sh
/// CRASH_LOOP_JOBS=20000 CRASH_LOOP_EVERY_S=15 cargo test --release \
///   --test worker_processes crash_loop -- --nocapture
/// ```
///
/// `CRASH_LOOP_MEMBERSHIP` = `cooperative` (the default protocol),
/// `eager` (`range`) or `kip848` (`group.protocol = consumer`) measures the
/// book's table of membership protocols (docs/src/deploy/kafka.md, "Rebalances and restarts").
///
/// `CRASH_LOOP_REDIS_LOSS=N` (issue 52) runs the workers on a Redis of
/// their own and, with every Nth kill, restarts it empty too (its data
/// lost, the epoch with it): the same checks then hold across the losses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_kill_9_a_random_replica_repeatedly_loses_and_over_admits_nothing() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let total = env("CRASH_LOOP_JOBS", 4000) as usize;
    let every = Duration::from_secs(env("CRASH_LOOP_EVERY_S", 6));
    const PARTITIONS: i32 = 8;
    let sellers = env("CRASH_LOOP_SELLERS", 20) as usize;
    let dir = Scratch::new("crash-loop");
    let n = Names::new("crash-loop");
    let broker = BrokerProc::start(dir.path(), &n.topics(PARTITIONS));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let mut cfg = n.config(&broker.bootstrap, RULES_TOML, "5s");
    cfg.rules = CRASH_LOOP_RULES;
    let config = cfg.write(dir.path(), "worker");
    let membership = std::env::var("CRASH_LOOP_MEMBERSHIP").unwrap_or_default();
    with_membership(&config, &membership);
    let redis_loss = env("CRASH_LOOP_REDIS_LOSS", 0) as usize;
    let mut redis = (redis_loss > 0).then(crate::common::redis_server::RedisServer::start);
    let redis_url = redis.as_ref().map(|r| r.url());
    let mut incarnation = 0usize;
    let mut spawn = |slot: usize| {
        incarnation += 1;
        let tag = format!("w{slot}.{incarnation}");
        let env: Vec<(&str, &str)> = redis_url
            .iter()
            .map(|u| ("THROTTLE__REDIS__URL", u.as_str()))
            .collect();
        start_worker_env(dir.path(), &tag, &config, &down.url(&tag), &env)
    };
    let mut redis_losses = 0usize;
    let mut workers: Vec<Proc> = (0..4).map(&mut spawn).collect();
    wait_settled(
        &workers.iter().collect::<Vec<_>>(),
        &n.jobs,
        PARTITIONS,
        Duration::from_secs(30),
    )
    .await;
    // The retry-tier consumers join too: under an eager protocol each join
    // stops every partition of the group, jobs included.
    wait_quiet(&workers, Duration::from_secs(4), Duration::from_secs(60)).await;
    let (ids, records) = jobs("loop", sellers, total / sellers);
    let produced = produce(&broker.bootstrap, &n.jobs, &records).await;
    let started = Instant::now();
    // (when, which slot, committed offsets just before the kill)
    let mut kills: Vec<(SystemTime, usize, BTreeMap<i32, Option<i64>>)> = Vec::new();
    // A liveness bound, generous: an eager group under kills spends most
    // of its time in rebalances.
    let deadline = started + Duration::from_secs(120 + 4 * total as u64 / 100);
    while down.distinct() < ids.len() {
        assert!(
            Instant::now() < deadline,
            "crash loop: only {} of {} jobs arrived after {:?} and {} kills",
            down.distinct(),
            ids.len(),
            started.elapsed(),
            kills.len()
        );
        tokio::time::sleep(every).await;
        if down.distinct() >= ids.len() {
            break;
        }
        let committed = committed_offsets(
            &broker.bootstrap,
            &n.group,
            &n.jobs,
            PARTITIONS,
            Duration::from_secs(5),
        )
        .await;
        let slot = rand::random::<u32>() as usize % workers.len();
        kills.push((SystemTime::now(), slot, committed));
        workers[slot].kill9();
        if let Some(r) = redis.as_mut().filter(|_| kills.len() % redis_loss == 0) {
            r.stop();
            r.restart();
            redis_losses += 1;
        }
        workers[slot] = spawn(slot);
    }
    let end = end_offsets(&produced);
    wait_committed_to_end(
        &broker.bootstrap,
        &n.group,
        &n.jobs,
        &end,
        Duration::from_secs(60),
    )
    .await;
    let run_time = started.elapsed();

    let arrivals = down.arrivals();
    let per_job = by_job(&arrivals);
    let missing: Vec<&String> = ids.iter().filter(|id| !per_job.contains_key(*id)).collect();
    assert!(missing.is_empty(), "crash loop: jobs lost: {missing:?}");

    // No seller over its limit: every call is one grant of the sliding log.
    // On Redis' clock (`X-Granted-At`) exactly: no second holds more than 20
    // grants. At the downstream, no call lands a period or more after its
    // grant; how tight its busiest 900 ms is, is shown (a busy machine's
    // scheduling spreads grant-to-arrival times, CI once saw 21).
    let mut by_seller: HashMap<&str, (Vec<u64>, Vec<u64>)> = HashMap::new();
    // Each call's time from its grant to its arrival. A grant older than
    // the rule's period when its call lands counts in a window it was not
    // charged to: that is an over-admission at the downstream, whatever
    // Redis' log says.
    let mut delays: HashMap<u64, Vec<i64>> = HashMap::new();
    let mut oldest = (0i64, String::new());
    for (w, a) in &arrivals {
        let (grants, arrived) = by_seller.entry(a.seller.as_str()).or_default();
        let granted = a
            .granted_at_us
            .unwrap_or_else(|| panic!("{}: no X-Granted-At from {w}", a.job_id));
        let wall = crate::common::unix_us(a.wall);
        grants.push(granted);
        arrived.push(wall);
        let delay = wall as i64 - granted as i64;
        delays.entry(wall).or_default().push(delay);
        if delay > oldest.0 {
            oldest = (delay, format!("{} via {w}", a.job_id));
        }
    }
    assert!(
        oldest.0 < 1_000_000,
        "crash loop: {} arrived {} ms after its grant, longer than its rule's 1 s period",
        oldest.1,
        oldest.0 / 1000
    );
    // The busiest seller (most calls), its busiest 900 ms and the span
    // from its first call to its last.
    let mut busiest_seller = (String::new(), 0usize, 0usize, Duration::ZERO);
    for (seller, (grants, times)) in by_seller.iter_mut() {
        let (granted, at) = crate::common::busiest_window(grants, 1_000_000);
        assert!(
            granted <= CRASH_LOOP_LIMIT,
            "crash loop: {seller} granted {granted} within 1 s on Redis' clock: {:?}",
            &grants[at]
        );
        let (tight, at) = crate::common::busiest_window(times, 900_000);
        if tight > CRASH_LOOP_LIMIT {
            // Grants at least a second apart (asserted above) land within
            // 900 ms only when one call took 100 ms longer than another
            // from grant to arrival: a busy machine's scheduling, bounded by
            // the stale-grant assertion above. Shown, with that spread.
            let window: Vec<i64> = times[at]
                .iter()
                .flat_map(|t| delays[t].iter().copied())
                .collect();
            let spread = window.iter().max().unwrap_or(&0) - window.iter().min().unwrap_or(&0);
            eprintln!(
                "crash loop: {seller} had {tight} calls arrive within 900 ms; their grant-to-arrival times spread {} ms",
                spread / 1000
            );
        }
        if times.len() > busiest_seller.2 {
            let span = Duration::from_micros(times[times.len() - 1] - times[0]);
            busiest_seller = (seller.to_string(), tight, times.len(), span);
        }
    }

    // Repeats: a job's partition can move only after its first call, and
    // the next owner starts at the committed offset of that moment, which is
    // at least what the last kill before the first call saw committed.
    let position: HashMap<&str, (i32, i64)> = ids
        .iter()
        .map(String::as_str)
        .zip(produced.iter().copied())
        .collect();
    let mut extra_per_kill = vec![0usize; kills.len() + 1];
    let mut extra = 0usize;
    for (id, calls) in &per_job {
        if calls.len() < 2 {
            continue;
        }
        extra += calls.len() - 1;
        let (p, o) = position[id.as_str()];
        let first = calls[0].1;
        if let Some((at, _, committed)) = kills.iter().rev().find(|(at, _, _)| *at <= first) {
            let c = committed.get(&p).copied().flatten().unwrap_or(0);
            assert!(
                o >= c,
                "crash loop: {id} (partition {p}, offset {o}) was first called {} ms after a kill that saw offset {c} committed, and called again",
                ms_between(first, *at)
            );
        }
        // Charged to the last kill before its second call.
        let k = kills.iter().filter(|(at, _, _)| *at <= calls[1].1).count();
        extra_per_kill[k] += calls.len() - 1;
    }
    // What each kill could cost at most: the jobs called before it at or
    // above the committed offset it saw (finished or in flight, uncommitted).
    let exposed: Vec<usize> = kills
        .iter()
        .map(|(at, _, committed)| {
            per_job
                .iter()
                .filter(|(id, calls)| {
                    let (p, o) = position[id.as_str()];
                    calls[0].1 < *at && o >= committed.get(&p).copied().flatten().unwrap_or(0)
                })
                .count()
        })
        .collect();
    let (seller, most, calls, span) = busiest_seller;
    eprintln!(
        "crash loop: membership {}",
        if membership.is_empty() {
            "cooperative (default)"
        } else {
            &membership
        }
    );
    eprintln!(
        "crash loop: {} jobs, {sellers} sellers at {CRASH_LOOP_LIMIT}/s, 4 worker processes on {PARTITIONS} partitions; \
         {} kill -9 + restart, one every {every:?}, {redis_losses} Redis restarts without its data; all done and committed after {run_time:?}; 0 lost, 0 over the limit",
        ids.len(),
        kills.len(),
    );
    eprintln!(
        "crash loop: duplicates: {extra} extra calls; per kill {:?} against the uncommitted-at-the-kill bound {exposed:?}",
        &extra_per_kill[1..],
    );
    // Quota use: the calls it made against what its limit allowed from its
    // first call to its last (one full window plus the limit's rate).
    let allowed = CRASH_LOOP_LIMIT as f64 * (1.0 + span.as_secs_f64());
    eprintln!(
        "crash loop: busiest seller {seller}: {calls} calls in {span:?} from first to last, {:.0}% of the {allowed:.0} its {CRASH_LOOP_LIMIT}/s allowed \
         (kills and rebalances cost the rest); its busiest 900 ms held {most}; the slowest call arrived {} ms after its grant",
        calls as f64 * 100.0 / allowed,
        oldest.0 / 1000,
    );
    assert_eq!(
        extra_per_kill[0], 0,
        "crash loop: jobs repeated before the first kill"
    );
}

/// A worker told to stop after its broker is gone exits, within
/// `worker.shutdown_timeout` and the Kafka clients' close timeout. It
/// logged "worker stopped" and then never exited: the close of the
/// librdkafka clients, left running on a blocking thread once its timeout
/// passed, kept the runtime (and the process) alive for good (found when
/// scripts/incident-demo.sh stopped its broker before its workers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_after_the_broker_is_gone_still_exits() {
    let dir = Scratch::new("orphan");
    let n = Names::new("orphan");
    let broker = BrokerProc::start(dir.path(), &n.topics(4));
    let down = TaggedDownstream::start(Duration::from_millis(1)).await;
    let config = n
        .config(&broker.bootstrap, RULES_TOML, "2s")
        .write(dir.path(), "worker");
    let mut workers: Vec<Proc> = (0..2)
        .map(|i| {
            start_worker(
                dir.path(),
                &format!("w{i}"),
                &config,
                &down.url(&format!("w{i}")),
            )
        })
        .collect();
    wait_settled(
        &workers.iter().collect::<Vec<_>>(),
        &n.jobs,
        4,
        Duration::from_secs(60),
    )
    .await;
    // The broker goes as the workers are told to stop (a script's cleanup,
    // a whole deployment torn down): their final commits and their leaving
    // the group get no answer.
    broker.proc.sigterm();
    let term = Instant::now();
    for w in &workers {
        w.sigterm();
    }
    // shutdown_timeout (2 s) + the final commit's 10 s + the close's 10 s,
    // and a margin.
    for w in &mut workers {
        let status = w
            .wait_exit(
                "a worker to exit with its broker gone",
                Duration::from_secs(40),
            )
            .await;
        println!(
            "exited {status} {:?} after SIGTERM, broker gone",
            term.elapsed()
        );
        assert!(
            w.log_text().contains("worker stopped"),
            "no \"worker stopped\" line"
        );
    }
}
