//! One run of a scenario: the producer, the process's incarnations (the
//! real engine each time), rebalances, crashes and clock jumps, in virtual
//! time on a paused current-thread runtime, then a graceful shutdown.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use throttle_worker::config::{OnStateLoss, Topology};
use throttle_worker::kafka::fence::Watch;
use throttle_worker::kafka::RetryHeaders;
use throttle_worker::limiter::{CoalesceSettings, Coalescer, KeySpace, Limiter, Policy};
use throttle_worker::telemetry::http::Health;
use throttle_worker::worker::{Deps, Engine, Ports, Summary};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;

use crate::lua_redis::EmbeddedRedis;

use super::broker::{deliver, watchdog, Broker, SharedBroker, SimLedger, SimRecord, SimSource, Tp};
use super::clock::SimClock;
use super::journal::{Journal, Log};
use super::ports::{
    job_value_with, sim_redis, SimDownstream, SimPermits, SimStore, SimWriter, Stall, World,
};
use super::scenario::Scenario;

/// How often a watched session's watchdog gives a sign of life (the
/// worker's watchdog thread ticks as often).
pub const ALIVE_EVERY: Duration = Duration::from_millis(100);

/// The simulation's ports.
pub struct SimPorts;

impl Ports for SimPorts {
    type Permits = SimPermits;
    type Source = SimSource;
    type Writer = SimWriter;
    type Caller = SimDownstream;
    type Clock = SimClock;
}

/// What a run left behind, for the invariants.
pub struct Outcome {
    pub log: Log,
    /// Panics inside the run (the engine's or a task's).
    pub panics: Vec<String>,
    /// Virtual ms when every job was finished, if they all were.
    pub settled_ms: Option<u64>,
    pub summary: Option<Summary>,
    pub end_ms: u64,
    /// What was left once every process stopped gracefully.
    pub end: End,
}

/// Every job is finished; what is left (a copy of a finished job
/// delivered again after a crash, or parked on a retry tier) still has to
/// come due and be read. Waits until every partition is committed to its
/// log's end, or the longest retry tier's delay and a minute more have
/// passed, whichever is first: then the processes stop, and invariant 11
/// judges what they left.
pub async fn drain_before_stop(sc: &Scenario, broker: &SharedBroker) {
    let longest = sc
        .settings()
        .kafka
        .retry_tiers()
        .iter()
        .map(|t| t.delay)
        .max()
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + longest + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline && !End::of(&[], broker).behind.is_empty() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What a run left behind (invariant 11).
#[derive(Debug, Default)]
pub struct End {
    /// Jobs waiting and records parked when each process's graceful stop
    /// began, summed over the processes.
    pub waiting: usize,
    pub parked: usize,
    /// Processes whose graceful stop did not return a summary.
    pub unstopped: usize,
    /// Partitions whose committed offset is short of their log's end:
    /// (partition, committed, end).
    pub behind: Vec<(Tp, i64, i64)>,
    /// Sellers with slots of `max_in_flight` still held in Redis at the
    /// end that no kill or data loss explains (see [`held_slots`]).
    pub held_slots: Vec<(String, i64)>,
}

impl End {
    /// From the processes' summaries (`None`: no summary) and the broker.
    pub fn of(summaries: &[Option<Summary>], broker: &SharedBroker) -> End {
        let b = broker.lock().unwrap_or_else(|p| p.into_inner());
        End {
            waiting: summaries.iter().flatten().map(|s| s.waiting_at_stop).sum(),
            parked: summaries.iter().flatten().map(|s| s.parked_at_stop).sum(),
            unstopped: summaries.iter().filter(|s| s.is_none()).count(),
            behind: b
                .logs
                .iter()
                .filter_map(|(tp, log)| {
                    let end = log.len() as i64;
                    let committed = b.committed_offset(tp);
                    (committed < end).then(|| (tp.clone(), committed, end))
                })
                .collect(),
            held_slots: Vec::new(),
        }
    }
}

/// Each capped seller's slots still held in Redis once every process has
/// stopped gracefully, beyond what a kill, a loss of Redis' data or a
/// failed return leaves. A lease lapses one `limits.slot_lease` after its
/// job's go-at, which is at most `worker.max_inline_delay` after its grant.
/// So a lease of a killed process (or of work a graceful stop abandoned at
/// its timeout), a loss's placeholder, or a lease whose return failed
/// while Redis was down, lapses by that long after the last kill,
/// abandonment, loss or Redis fault. A lease that outlives that and the
/// end was not given back by a process that stopped gracefully.
pub fn held_slots(sc: &Scenario, world: &World, policy: &Policy) -> Vec<(String, i64)> {
    let keys = KeySpace::new("sim");
    let lease_us = policy.slot_lease().as_micros() as u64;
    let last_us = |ms: Option<u64>| ms.map_or(0, |ms| super::clock::EPOCH_US + ms * 1_000);
    let kill = last_us(
        world
            .journal
            .with(|log| log.kills.iter().chain(&log.abandoned).copied().max()),
    );
    let loss = last_us(world.faults.state_losses.iter().copied().max());
    // A return that fails (Redis down or hung) leaves its slots to lapse.
    let fault = last_us(
        world
            .faults
            .redis_errors
            .iter()
            .chain(&world.faults.redis_hangs)
            .chain(world.faults.replica_redis.iter().map(|(w, _, _)| w))
            .chain(super::check::slow_past_timeout(sc))
            .map(|w| w.to_ms)
            .max(),
    );
    // A lease runs from its job's go-at, which a grant may set ahead of
    // the grant, by at most what the worker holds a job in memory.
    let ahead_us = sc.settings().worker.max_inline_delay.as_micros() as u64;
    let now = world.clock.true_unix_us();
    let after = now.max(kill.max(loss).max(fault) + ahead_us + lease_us);
    let redis = world.redis.lock().unwrap_or_else(|p| p.into_inner());
    sc.sellers
        .iter()
        .filter(|s| s.max_in_flight.is_some())
        .filter_map(|s| {
            let key = keys.slots(&s.name);
            let held = match redis.command(&["ZCOUNT", &key, &format!("({after}"), "+inf"], now) {
                Ok(crate::lua_redis::Reply::Int(n)) => n,
                other => panic!("ZCOUNT {key}: {other:?}"),
            };
            if held > 0 && std::env::var_os("SIM_TRACE").is_some() {
                let leases = redis.command(
                    &[
                        "ZRANGEBYSCORE",
                        &key,
                        &format!("({after}"),
                        "+inf",
                        "WITHSCORES",
                    ],
                    now,
                );
                println!("held at the end ({now} µs): {key}: {leases:?}");
            }
            (held > 0).then(|| (s.name.clone(), held))
        })
        .collect()
}

thread_local! {
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static IN_RUN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Panics are caught per thread (each run has its own thread and runtime)
/// and reported as a broken invariant, with their message.
fn catch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_RUN.with(|r| r.get()) {
                return default(info);
            }
            PANICS.with(|p| p.borrow_mut().push(info.to_string()));
            if std::env::var_os("SIM_VERBOSE").is_some() {
                default(info);
            }
        }));
    });
}

/// One process lifetime.
pub struct Incarnation {
    pub dead: Arc<AtomicBool>,
    pub source: Arc<SimSource>,
    pub parts: mpsc::UnboundedSender<throttle_worker::kafka::consumer::PartitionEvent>,
    pub engine: JoinHandle<Summary>,
    pub shutdown: Option<oneshot::Sender<()>>,
    /// Its stall, when the fleet makes one (`Scenario::stalls`).
    pub stall: Arc<Stall>,
    /// Its number (`start`'s `generation`), as its calls name it.
    pub process: u64,
    /// Its limiter, to hand it edited limits (`reload`).
    pub limiter: Arc<Limiter<SimStore>>,
    world: Arc<World>,
}

impl Incarnation {
    /// kill -9: nothing more is finished, committed or answered.
    pub fn kill(&self) {
        let at = self.world.now_ms();
        self.world.journal.with(|log| log.ends.push(at));
        self.dead.store(true, Ordering::SeqCst);
        self.engine.abort();
    }

    /// A live edit of `[limits]`: the process's limiter is handed the new
    /// policy as `worker::reload` hands it (`Limiter::set_policy`), the
    /// product's own swap; its limiter calls under way finish with the
    /// old one. Journalled: edit `k` (`Scenario::edits`) applied now.
    pub fn reload(&self, k: usize, policy: &Policy) {
        if self.dead.load(Ordering::SeqCst) {
            return;
        }
        self.limiter.set_policy(policy.clone());
        let at = self.world.now_ms();
        self.world
            .journal
            .with(|log| log.edits_applied.push((k, at)));
    }

    /// A graceful stop: the engine drains and commits; its summary.
    pub async fn stop(mut self) -> Option<Summary> {
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
        let summary = match tokio::time::timeout(Duration::from_secs(60), &mut self.engine).await {
            Ok(Ok(s)) => Some(s),
            _ => None,
        };
        self.dead.store(true, Ordering::SeqCst);
        let at = self.world.now_ms();
        self.world.journal.with(|log| log.ends.push(at));
        // Work still under way at `worker.shutdown_timeout` is abandoned
        // like a kill's: its records stay uncommitted, its slots lapse.
        if summary.as_ref().is_none_or(|s| s.abandoned > 0) {
            let at = self.world.now_ms();
            self.world.journal.with(|log| log.abandoned.push(at));
        }
        summary
    }
}

pub fn topic_partitions(sc: &Scenario) -> Vec<Tp> {
    let settings = sc.settings();
    let mut all: Vec<Tp> = (0..sc.partitions)
        .map(|p| (settings.kafka.topic.clone(), p))
        .collect();
    for tier in settings.kafka.retry_tiers() {
        for p in 0..sc.tier_partitions {
            all.push((tier.topic.clone(), p));
        }
    }
    all
}

/// Starts a process: a fresh engine on its own consumer, which takes
/// `initial` at once. With `watch`, its session is watched as the
/// worker's is (`kafka::fence`): a watchdog gives signs of life every
/// `ALIVE_EVERY`, and the process may stall (`Incarnation::stall`).
#[allow(clippy::too_many_arguments)]
pub fn start(
    sc: &Scenario,
    world: &Arc<World>,
    policy: &Policy,
    generation: u64,
    wake: &Arc<Mutex<Arc<Notify>>>,
    initial: &[Tp],
    skew_us: i64,
    watch: Option<Watch>,
) -> Incarnation {
    let settings = Arc::new(sc.settings());
    let dead = Arc::new(AtomicBool::new(false));
    let started = world.now_ms();
    world.journal.with(|log| log.starts.push(started));
    let notify = Arc::new(Notify::new());
    *wake.lock().unwrap_or_else(|p| p.into_inner()) = notify.clone();
    let stall = Arc::new(Stall::default());
    let source = Arc::new(SimSource::new(
        world.broker.clone(),
        world.journal.clone(),
        Arc::new(SimLedger {
            world: world.clone(),
            process: generation,
        }),
        notify,
        dead.clone(),
        settings.revoke_wait(),
        stall.clone(),
        watch,
    ));
    let store = SimStore {
        world: world.clone(),
        dead: dead.clone(),
        process: generation,
        stall: stall.clone(),
    };
    let limiter = Limiter::new(
        store,
        KeySpace::new("sim"),
        policy.clone(),
        Topology::Single,
    )
    .with_state_loss(OnStateLoss::Wait)
    // As `worker::start` builds it: a bounded hold, within which every
    // replica writes back its own grants (`limiter::restore`), each
    // process under a name of its own.
    .with_state_loss_wait(settings.redis.state_loss_wait)
    .with_restore(format!("sim-{generation}"), settings.redis.restore_bytes);
    // As `worker::start` reads it: a group that never committed on the
    // jobs topic is a new install; the first charging call reads the
    // group's commits again, writes the epoch and commits this process's
    // start positions before it goes (`Limiter::set_install_check`), so a
    // replica that
    // has not called yet does not take a later loss for a first deploy.
    let limiter = Arc::new(limiter);
    watch_losses(&limiter, world, &dead);
    let topic = settings.kafka.topic.clone();
    let committed = {
        let world = world.clone();
        move || {
            world
                .broker
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .committed
                .keys()
                .any(|(t, _)| *t == topic)
        }
    };
    if sc.fresh_install && !committed() {
        limiter.set_new_install(true);
        let (source, weak) = (source.clone(), Arc::downgrade(&limiter));
        limiter.set_install_check(Arc::new(move || {
            let (source, committed, weak) = (source.clone(), committed.clone(), weak.clone());
            Box::pin(async move {
                if committed() {
                    return Err("the group has committed since".to_owned());
                }
                let limiter = weak.upgrade().ok_or("stopping")?;
                limiter
                    .begin_install()
                    .await
                    .map_err(|e| format!("could not write the epoch: {e}"))?;
                source.commit_start()?;
                if committed() {
                    Ok(())
                } else {
                    Err("no record of the jobs topic to commit".to_owned())
                }
            })
        }));
    }
    let (rec_tx, rec_rx) = mpsc::channel(64);
    let (part_tx, part_rx) = mpsc::unbounded_channel();
    let deps: Deps<SimPorts> = Deps {
        permits: Arc::new(SimPermits {
            inner: Coalescer::start(
                limiter.clone(),
                CoalesceSettings {
                    max: settings.redis.max_coalesced,
                    window: settings.redis.coalesce_window,
                    ..CoalesceSettings::default()
                },
            ),
            world: world.clone(),
        }),
        caller: Arc::new(SimDownstream {
            world: world.clone(),
            dead: dead.clone(),
            process: generation,
            stall: stall.clone(),
        }),
        writer: Arc::new(SimWriter {
            world: world.clone(),
            dead: dead.clone(),
            stall: stall.clone(),
            tier_partitions: sc.tier_partitions,
        }),
        source: source.clone(),
        // The host's wall clock: the world's (which may jump), off by the
        // process's own skew.
        clock: if watch.is_some() {
            Arc::new(SimClock::stalling(&world.clock, skew_us, stall.clone()))
        } else if skew_us == 0 {
            world.clock.clone()
        } else {
            Arc::new(SimClock::skewed(&world.clock, skew_us))
        },
        records: rec_rx,
        partitions: part_rx,
        health: Health::new(Duration::from_secs(10)),
        jobs_partitions: sc.partitions as usize * sc.fleet.max(1),
        seed: sc.seed.wrapping_add(generation),
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let engine = Engine::new(settings, deps);
    let engine = tokio::spawn(engine.run(async move {
        let _ = stop_rx.await;
    }));
    source.assign(initial, &part_tx);
    tokio::spawn(deliver(source.clone(), rec_tx, sc.fetch));
    if watch.is_some() {
        tokio::spawn(watchdog(source.clone(), ALIVE_EVERY));
    }
    Incarnation {
        stall,
        process: generation,
        limiter,
        world: world.clone(),
        dead,
        source,
        parts: part_tx,
        engine,
        shutdown: Some(stop_tx),
    }
}

/// The epoch task of `worker::refresh` on the simulation's clock: every
/// `epoch_watch_interval`, the epoch and the partial losses' finds are
/// read, and what this process restores is counted. Ends with the process.
fn watch_losses(limiter: &Arc<Limiter<SimStore>>, world: &Arc<World>, dead: &Arc<AtomicBool>) {
    let Some(every) = limiter.epoch_watch_interval() else {
        return;
    };
    let (limiter, world, dead) = (limiter.clone(), world.clone(), dead.clone());
    tokio::spawn(async move {
        while !dead.load(Ordering::SeqCst) {
            tokio::time::sleep(every).await;
            if let Some(r) = limiter.watch_epoch().await {
                world.journal.with(|log| {
                    log.reach.restores += r.hashes as u64;
                    log.reach.units_restored += r.units;
                });
            }
            for r in limiter.watch_rollbacks().await {
                world.journal.with(|log| {
                    log.reach.partial_restores += r.hashes as u64;
                    log.reach.units_restored += r.units;
                });
            }
        }
    });
}

/// What happens when, in virtual ms.
enum Step {
    Produce(usize),
    Crash(u64),
    Restart,
    Revoke(Vec<i32>, u64),
    Assign(Vec<i32>),
    Fence(u64),
    Confirm,
    Jump(i64),
    /// The broker loses the group's commits of the last that many ms.
    LoseCommits(u64),
    /// `Scenario::edits[k]`: the config file edited.
    Edit(usize),
}

/// Each era's policy: the scenario's limits from the start, then after
/// each edit (`Scenario::eras`).
pub fn policies(sc: &Scenario) -> Vec<Policy> {
    sc.eras()
        .iter()
        .map(|era| {
            Policy::from_config(&era.settings().limits)
                .expect("the scenario's limits are valid in every era")
        })
        .collect()
}

/// The broker loses the group's commits of the last `age_ms`
/// (`Faults::lost_commits`), journalled.
pub fn lose_commits(world: &World, age_ms: u64) {
    let now = world.now_ms();
    let lost = world
        .broker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .lose_commits(now, age_ms);
    world.journal.lost_commits(&lost);
}

/// Runs `sc` on a fresh paused runtime of this thread.
pub fn run(sc: &Scenario) -> Outcome {
    run_on_paused_runtime(run_async(sc))
}

/// Runs a world to its outcome on a fresh paused current-thread runtime,
/// catching its panics.
pub fn run_on_paused_runtime(world: impl std::future::Future<Output = Outcome>) -> Outcome {
    catch_panics();
    PANICS.with(|p| p.borrow_mut().clear());
    IN_RUN.with(|r| r.set(true));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let mut out = rt.block_on(world);
    drop(rt);
    IN_RUN.with(|r| r.set(false));
    out.panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    out
}

/// The world of a scenario: clock, journal, broker, Redis, the downstream's
/// faults; and each job's record value.
pub fn world_of(sc: &Scenario) -> (Arc<World>, Vec<bytes::Bytes>) {
    let clock = Arc::new(SimClock::new());
    let journal = Arc::new(Journal::default());
    let broker = Arc::new(Mutex::new(Broker::default()));
    let values: Vec<_> = sc
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            if j.malformed {
                bytes::Bytes::from(format!("not json {i}"))
            } else {
                let seller = &sc.sellers[j.seller].name;
                let mut v = job_value_with(i, seller, j.cost, j.priority, j.sku.as_deref());
                if j.pad > 0 {
                    let text = String::from_utf8_lossy(&v).replace(
                        r#""payload":{"#,
                        &format!(r#""payload":{{"pad":"{}","#, "x".repeat(j.pad)),
                    );
                    v = bytes::Bytes::from(text);
                }
                v
            }
        })
        .collect();
    journal.with(|log| {
        for (i, v) in values.iter().enumerate() {
            log.by_value.insert(v.clone(), i);
            log.by_job_id.insert(format!("job-{i}"), i);
        }
    });
    let world = Arc::new(World {
        clock,
        journal,
        broker,
        faults: sc.faults.clone(),
        poison: sc.jobs.iter().map(|j| j.poison).collect(),
        redis: Mutex::new(if sc.fresh_install {
            sim_redis()
        } else {
            installed()
        }),
        losses: Default::default(),
        rollbacks: Default::default(),
        copies: Default::default(),
        failovers: Default::default(),
        snapshots: Default::default(),
        rng: World::seeded(sc.seed),
        downstream_busy: Default::default(),
        rate_windows: Default::default(),
        members: Default::default(),
    });
    (world, values)
}

/// Redis as an install that has run before finds it: the loss guard's
/// epoch written a day ago (a new install would hold each seller's first
/// period), and the server key naming this server (an epoch without it
/// reads as a move to an older copy: `server_moved`, `lua/common.lua`).
fn installed() -> EmbeddedRedis {
    let redis = sim_redis();
    let day_us = 86_400_000_000u64;
    let keys = KeySpace::new("sim");
    let epoch = keys.epoch(Topology::Single, "");
    let at = (super::clock::EPOCH_US - day_us).to_string();
    redis
        .command(&["SET", &epoch, &at], super::clock::EPOCH_US)
        .unwrap_or_else(|e| panic!("SET {epoch}: {e}"));
    let run = redis.run_id();
    redis
        .command(
            &["SET", &keys.server(), &format!("{run} 0 0")],
            super::clock::EPOCH_US,
        )
        .unwrap_or_else(|e| panic!("SET the server key: {e}"));
    redis
}

/// Appends job `j`'s record to its partition of the jobs topic.
pub fn produce(sc: &Scenario, world: &World, values: &[bytes::Bytes], j: usize) {
    let spec = &sc.jobs[j];
    let tp = (sc.settings().kafka.topic, spec.partition);
    let key = (!spec.malformed).then(|| sc.sellers[spec.seller].name.clone().into_bytes());
    let rec = SimRecord {
        key,
        value: values[j].clone(),
        headers: RetryHeaders::default(),
    };
    world
        .broker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .append(&tp, rec);
}

/// Whether every job is done or dead-lettered.
pub fn all_finished(sc: &Scenario, world: &World) -> bool {
    world.journal.with(|log| {
        (0..sc.jobs.len())
            .all(|j| log.done.contains_key(&j) || log.dead.iter().any(|(d, _)| *d == j))
    })
}

/// Runs `sc`'s process lifetimes on the current (paused) runtime.
async fn run_async(sc: &Scenario) -> Outcome {
    let (world, values) = world_of(sc);
    let (clock, journal, broker) = (
        world.clock.clone(),
        world.journal.clone(),
        world.broker.clone(),
    );
    let settings = sc.settings();
    let policies = policies(sc);
    // The policy in force: a process started after an edit reads the
    // edited file.
    let mut policy = policies[0].clone();
    let mut steps: Vec<(u64, Step)> = Vec::new();
    for (k, e) in sc.edits.iter().enumerate() {
        steps.push((e.at_ms, Step::Edit(k)));
    }
    for (i, j) in sc.jobs.iter().enumerate() {
        steps.push((j.at_ms, Step::Produce(i)));
    }
    for &(at, down) in &sc.crashes {
        steps.push((at, Step::Crash(down)));
    }
    for (at, parts, dur) in &sc.rebalances {
        steps.push((*at, Step::Revoke(parts.clone(), *dur)));
    }
    for &(at, by) in &sc.clock_jumps {
        steps.push((at, Step::Jump(by)));
    }
    for &(at, dur) in &sc.fences {
        steps.push((at, Step::Fence(dur)));
    }
    for &(at, age) in &sc.faults.lost_commits {
        steps.push((at, Step::LoseCommits(age)));
    }
    let wake = Arc::new(Mutex::new(Arc::new(Notify::new())));
    let mut generation = 0u64;
    let mut current = Some(start(
        sc,
        &world,
        &policy,
        generation,
        &wake,
        &topic_partitions(sc),
        0,
        None,
    ));
    let jobs_topic = settings.kafka.topic.clone();
    let mut i = 0;
    let mut settled_ms = None;
    let start_at = tokio::time::Instant::now();
    loop {
        steps.sort_by_key(|(at, _)| *at);
        let next_at = steps.get(i).map(|(at, _)| *at);
        let now = clock.elapsed_ms();
        if next_at.is_none() {
            if all_finished(sc, &world) && current.is_some() {
                settled_ms = Some(now);
                break;
            }
            if now >= sc.limit_ms {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let at = next_at.unwrap_or(0);
        if at > now {
            tokio::time::sleep_until(start_at + Duration::from_millis(at)).await;
        }
        let step = std::mem::replace(&mut steps[i].1, Step::Jump(0));
        i += 1;
        match step {
            Step::Produce(j) => {
                produce(sc, &world, &values, j);
                wake.lock().unwrap_or_else(|p| p.into_inner()).notify_one();
            }
            Step::Crash(down) => {
                if let Some(inc) = current.take() {
                    inc.kill();
                    journal.with(|log| log.kills.push(clock.elapsed_ms()));
                    generation += 1;
                    let at = clock.elapsed_ms() + down;
                    steps.push((at, Step::Restart));
                }
            }
            Step::Restart => {
                if current.is_none() {
                    current = Some(start(
                        sc,
                        &world,
                        &policy,
                        generation,
                        &wake,
                        &topic_partitions(sc),
                        0,
                        None,
                    ));
                }
            }
            Step::Revoke(parts, dur) => {
                if let Some(inc) = &current {
                    let tps: Vec<Tp> = parts
                        .iter()
                        .map(|p| (jobs_topic.clone(), *p))
                        .filter(|tp| inc.source.owned().contains(tp))
                        .collect();
                    if !tps.is_empty() {
                        inc.source.revoke(&tps, &inc.parts).await;
                        broker.lock().unwrap_or_else(|p| p.into_inner()).rebalancing = true;
                        let at = clock.elapsed_ms() + dur;
                        steps.push((at, Step::Assign(tps.iter().map(|(_, p)| *p).collect())));
                    }
                }
            }
            Step::Assign(parts) => {
                broker.lock().unwrap_or_else(|p| p.into_inner()).rebalancing = false;
                if let Some(inc) = &current {
                    let owned = inc.source.owned();
                    let tps: Vec<Tp> = parts
                        .iter()
                        .map(|p| (jobs_topic.clone(), *p))
                        .filter(|tp| !owned.contains(tp))
                        .collect();
                    inc.source.assign(&tps, &inc.parts);
                }
            }
            Step::Fence(dur) => {
                if let Some(inc) = &current {
                    inc.source.fence();
                    steps.push((clock.elapsed_ms() + dur, Step::Confirm));
                }
            }
            // A rebalance with this member in it: an assignment of nothing
            // new (a restarted process is not fenced; this changes nothing).
            Step::Confirm => {
                if let Some(inc) = &current {
                    inc.source.assign(&[], &inc.parts);
                }
            }
            Step::Jump(by) => clock.jump(by),
            Step::LoseCommits(age) => lose_commits(&world, age),
            Step::Edit(k) => {
                policy = policies[k + 1].clone();
                if let Some(inc) = &current {
                    inc.reload(k, &policy);
                }
            }
        }
    }
    drain_before_stop(sc, &broker).await;
    let mut summary = None;
    if let Some(inc) = current.take() {
        summary = inc.stop().await;
    }
    let mut end = End::of(std::slice::from_ref(&summary), &broker);
    end.held_slots = held_slots(sc, &world, &policy);
    let end_ms = clock.elapsed_ms();
    let log = journal.with(std::mem::take);
    Outcome {
        log,
        panics: Vec::new(),
        settled_ms,
        summary,
        end_ms,
        end,
    }
}
