//! A fleet: several replicas of the real engine in one consumer group,
//! sharing the broker, Redis and the downstream, with a group coordinator
//! that moves partitions by a membership protocol when a replica is killed
//! and started again. It measures what a protocol costs (quota use, calls
//! made twice), and runs the invariants with replicas contending for one
//! limit.
//!
//! The coordinator follows librdkafka's mock broker, whose figures the
//! book (docs/src/deploy/kafka.md) reports beside these: a killed member is noticed after the session
//! timeout, and its restarted self joins at once but is given partitions
//! only when that rebalance completes.
//! - Eager (`range`): at the first heartbeat after a join (`heartbeat_ms`),
//!   every member gives up every partition (committing its finished prefix,
//!   which the mock refuses while the group rebalances);
//!   when the session of the dead member ends, each topic is assigned in
//!   ranges over the members.
//! - Cooperative (`cooperative-sticky`): nobody stops at the join. When the
//!   session ends, the dead member's partitions go to their new owners at
//!   once, and a partition that moves between live members is given up
//!   then and assigned after a second round (`second_round_ms`).
//!
//! Both run one consumer for the jobs topic and one for the retry tiers, as
//! the worker does: each role is balanced over the members on its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;

use throttle_worker::kafka::fence::Watch;

use super::broker::Tp;
use super::journal::Stalled;
use super::run::{
    all_finished, produce, run_on_paused_runtime, start, topic_partitions, world_of, Incarnation,
    Outcome,
};
use super::scenario::{Scenario, EDIT_SPREAD_MS};

/// Mixed into a world's seed for the fleet's own draws (replicas, kills,
/// protocol), so that they do not repeat the world's draws.
const FLEET_SALT: u64 = 0x0066_6c65_6574;
/// When each replica reloads a live edit of `[limits]`.
const RELOAD_SALT: u64 = 0x2e10_ad00_0000_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    Eager,
    Cooperative,
}

/// What happens to the fleet at each lifecycle step: weights of each
/// event (0: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// kill -9 of a random replica, started again at once.
    pub kill: u32,
    /// A replica added (scale out), with a graceful join.
    pub join: u32,
    /// A replica stopped gracefully (scale in); never the last.
    pub leave: u32,
    /// A replica stopped gracefully and started again (a rolling restart's
    /// step).
    pub restart: u32,
}

impl Lifecycle {
    pub const KILLS: Lifecycle = Lifecycle {
        kill: 1,
        join: 0,
        leave: 0,
        restart: 0,
    };
}

#[derive(Debug, Clone)]
pub struct Fleet {
    pub replicas: usize,
    /// Joins stop at this many replicas.
    pub max_replicas: usize,
    pub membership: Membership,
    /// A lifecycle step (see `lifecycle`) this often, until every job is
    /// finished.
    pub kill_every_ms: u64,
    pub lifecycle: Lifecycle,
    /// Each process's wall clock is off the store's by up to this, either
    /// way (drawn per process).
    pub skew_ms: u64,
    /// A rebalance that a graceful join or leave starts completes this long
    /// after it (a kill's waits for the session timeout).
    pub rebalance_ms: u64,
    pub session_ms: u64,
    pub heartbeat_ms: u64,
    pub second_round_ms: u64,
    /// No kill after this (virtual ms); `None`: until every job is finished.
    pub kills_until_ms: Option<u64>,
    /// The mock refuses every commit while the group rebalances (from the
    /// restarted member's join until the last round), so work finished
    /// meanwhile, and the commit of a partition given up, fail there (real
    /// Kafka takes the current generation's): that work is redone.
    pub refuse_commits_in_rebalance: bool,
}

impl Fleet {
    /// What seed `seed` draws for the world `sc`: 2 to 4 replicas, a
    /// protocol, a lifecycle step every 2 to 15 s while `sc`'s faults last
    /// (kills only, graceful joins, leaves and restarts only, or both),
    /// wall clocks skewed or not, commits refused in a rebalance or not.
    pub fn random(seed: u64, sc: &Scenario) -> Fleet {
        let mut r = StdRng::seed_from_u64(seed ^ FLEET_SALT);
        let replicas = r.random_range(2..=4);
        let graceful = |r: &mut StdRng| Lifecycle {
            kill: 0,
            join: r.random_range(1..=3),
            leave: r.random_range(1..=3),
            restart: r.random_range(0..=2),
        };
        let lifecycle = match r.random_range(0..4) {
            0 | 1 => Lifecycle::KILLS,
            2 => graceful(&mut r),
            _ => Lifecycle {
                kill: 1,
                ..graceful(&mut r)
            },
        };
        let skew_ms = if r.random_bool(0.5) {
            0
        } else {
            r.random_range(1..=5_000)
        };
        Fleet {
            replicas,
            max_replicas: replicas + 2,
            lifecycle,
            skew_ms,
            rebalance_ms: r.random_range(300..=3_000),
            membership: if r.random_bool(0.5) {
                Membership::Eager
            } else {
                Membership::Cooperative
            },
            kill_every_ms: r.random_range(2_000..=15_000),
            session_ms: 3_000,
            heartbeat_ms: 300,
            second_round_ms: r.random_range(100..=2_000),
            refuse_commits_in_rebalance: r.random_bool(0.5),
            kills_until_ms: Some(sc.faults_end_ms),
        }
    }

    /// The crash loop of `tests/worker/processes.rs` on the mock broker's
    /// timings there (`session.timeout.ms` 3 s, heartbeat 300 ms).
    pub fn crash_loop(membership: Membership) -> Fleet {
        Fleet {
            replicas: 4,
            max_replicas: 4,
            lifecycle: Lifecycle::KILLS,
            skew_ms: 0,
            rebalance_ms: 2_000,
            membership,
            kill_every_ms: 8_000,
            session_ms: 3_000,
            heartbeat_ms: 300,
            second_round_ms: 2_000,
            kills_until_ms: None,
            refuse_commits_in_rebalance: true,
        }
    }
}

/// A replica slot: its process, and an id for each process it has run.
struct Member {
    id: u64,
    inc: Incarnation,
    wake: Arc<Mutex<Arc<Notify>>>,
}

enum Step {
    /// Job `j` is produced.
    Produce(usize),
    /// A lifecycle step: kill, join, leave or restart (see [`Lifecycle`]).
    Life,
    /// Eager: every member gives up its partitions.
    StopAll,
    /// The dead member's session ended: the group's new assignment.
    Settle,
    /// Cooperative: the partitions given up at `Settle` reach their owners.
    SecondRound(Vec<(Tp, u64)>),
    /// A replica stalls (`Scenario::stalls`, by index).
    Stall(usize),
    /// The stalled member's session ends: the group expels it and gives
    /// its partitions to the others.
    Expire(u64),
    /// The first heartbeat after its resume is refused: librdkafka
    /// revokes its assignment as lost, and it joins again.
    Lost(u64),
    /// The broker loses the group's commits of the last that many ms.
    LoseCommits(u64),
    /// `Scenario::edits[k]`: the limits file edited (a ConfigMap
    /// applied); each replica reloads it within `EDIT_SPREAD_MS`.
    Edit(usize),
    /// Member `id` reloads for edit `k` (if it is still there): the file
    /// as it is then.
    Reload(u64, usize),
}

/// Runs `sc` (its jobs and downstream faults; its own crashes and
/// rebalances are not used) on `fleet`.
pub fn run_fleet(sc: &Scenario, fleet: &Fleet) -> Outcome {
    run_on_paused_runtime(run_async(sc, fleet))
}

async fn run_async(sc: &Scenario, fleet: &Fleet) -> Outcome {
    let (world, values) = world_of(sc);
    let policies = super::run::policies(sc);
    // The policy in force: a replica started after an edit reads the
    // edited file.
    let policy = std::cell::RefCell::new(policies[0].clone());
    // When each replica sees an edit, from a generator of its own (the
    // fleet's draws stay what they were without edits).
    let mut spread = StdRng::seed_from_u64(sc.seed ^ RELOAD_SALT);
    let mut rng = StdRng::seed_from_u64(sc.seed ^ FLEET_SALT);
    let roles = roles(sc);
    let mut next_id = 0u64;
    // In a world with stalls, each session is watched as the worker's is.
    let watch = (!sc.stalls.is_empty()).then(|| Watch {
        consumer: "jobs",
        stall_after: Duration::from_millis(fleet.session_ms - fleet.heartbeat_ms),
        confirm_after: Duration::from_millis(fleet.session_ms),
    });
    let mut spawn = |parts: &[Tp], rng: &mut StdRng| {
        next_id += 1;
        let wake = Arc::new(Mutex::new(Arc::new(Notify::new())));
        let skew_ms = fleet.skew_ms as i64;
        let skew_us = rng.random_range(-skew_ms..=skew_ms) * 1_000;
        // The process's generation, and its id for the faults
        // (`publish`).
        let inc = start(
            sc,
            &world,
            &policy.borrow(),
            next_id << 32,
            &wake,
            parts,
            skew_us,
            watch,
        );
        Member {
            id: next_id,
            inc,
            wake,
        }
    };
    // The group formed before the jobs arrive, as in the crash loop.
    let ids: Vec<u64> = (1..=fleet.replicas as u64).collect();
    let first = assign(&roles, &BTreeMap::new(), &ids, fleet.membership);
    let mut owner: BTreeMap<Tp, u64> = first.clone();
    // A graceful leaver's summary is not the end state: what it left is
    // its partitions' next owner's.
    let mut members: Vec<Member> = ids
        .iter()
        .map(|id| spawn(&owned_by(&first, *id), &mut rng))
        .collect();
    publish(&world, &members);
    let start_at = tokio::time::Instant::now();
    let mut steps: Vec<(u64, Step)> = vec![(fleet.kill_every_ms, Step::Life)];
    for (j, spec) in sc.jobs.iter().enumerate() {
        steps.push((spec.at_ms, Step::Produce(j)));
    }
    for (i, stall) in sc.stalls.iter().enumerate() {
        steps.push((stall.0, Step::Stall(i)));
    }
    for &(at, age) in &sc.faults.lost_commits {
        steps.push((at, Step::LoseCommits(age)));
    }
    for (k, e) in sc.edits.iter().enumerate() {
        steps.push((e.at_ms, Step::Edit(k)));
    }
    // The member stalled, from its stall until a rebalance assigns it
    // again; its stall's place in the journal; whether it has joined
    // again (its next settle confirms it).
    let mut stalled: Option<(u64, usize)> = None;
    let mut rejoined = false;
    let mut settled_ms = None;
    while !steps.is_empty() {
        steps.sort_by_key(|(at, _)| *at);
        let (at, step) = steps.remove(0);
        tokio::time::sleep_until(start_at + Duration::from_millis(at)).await;
        let now = world.now_ms();
        match step {
            Step::Produce(j) => {
                produce(sc, &world, &values, j);
                for m in &members {
                    m.wake
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .notify_one();
                }
            }
            Step::Life => {
                if all_finished(sc, &world) {
                    settled_ms = Some(now);
                    continue;
                }
                if now >= sc.limit_ms || fleet.kills_until_ms.is_some_and(|end| now >= end) {
                    continue;
                }
                steps.push((now + fleet.kill_every_ms, Step::Life));
                // No lifecycle step while a member is stalled: the
                // coordinator's steps for it are its own.
                if stalled.is_some() {
                    continue;
                }
                let settle_in = match pick(&mut rng, fleet, members.len()) {
                    Event::Kill => {
                        let slot = rng.random_range(0..members.len());
                        members[slot].inc.kill();
                        world.journal.with(|log| log.kills.push(now));
                        members[slot] = spawn(&[], &mut rng);
                        // The dead member is noticed when its session ends.
                        fleet.session_ms
                    }
                    Event::Join => {
                        members.push(spawn(&[], &mut rng));
                        fleet.rebalance_ms
                    }
                    Event::Leave => {
                        let slot = rng.random_range(0..members.len());
                        let m = members.remove(slot);
                        // SIGTERM: the engine drains and makes its final
                        // commit, then the consumer leaves the group.
                        m.inc.stop().await;
                        fleet.rebalance_ms
                    }
                    Event::Restart => {
                        let slot = rng.random_range(0..members.len());
                        let m = std::mem::replace(&mut members[slot], spawn(&[], &mut rng));
                        m.inc.stop().await;
                        fleet.rebalance_ms
                    }
                };
                publish(&world, &members);
                let now = world.now_ms();
                // A join or a leave starts a rebalance.
                set_rebalancing(&world, fleet.refuse_commits_in_rebalance);
                steps.push((now + settle_in, Step::Settle));
                if fleet.membership == Membership::Eager {
                    steps.push((now + fleet.heartbeat_ms.min(settle_in), Step::StopAll));
                }
            }
            Step::StopAll => {
                // Every member's revoke at once, each waiting for its own
                // work under way (eager: the whole group stops).
                let held: Vec<Vec<Tp>> = members.iter().map(|m| m.inc.source.owned()).collect();
                let mut revokes = Vec::new();
                for (m, held) in members.iter().zip(&held) {
                    // An expelled member is not in the rebalance.
                    if !held.is_empty() && !m.inc.source.expelled() {
                        revokes.push(m.inc.source.revoke(held, &m.inc.parts));
                    }
                }
                futures::future::join_all(revokes).await;
                owner.clear();
            }
            Step::Settle => {
                // An expelled member is out of the group until it joins
                // again.
                let in_group =
                    |m: &Member| !m.inc.source.expelled() || (rejoined && in_stall(stalled, m));
                let live: Vec<u64> = members
                    .iter()
                    .filter(|m| in_group(m))
                    .map(|m| m.id)
                    .collect();
                let target = assign(&roles, &owner, &live, fleet.membership);
                let mut later = Vec::new();
                let mut moves = Vec::new();
                for m in members.iter().filter(|m| in_group(m)) {
                    let mut give_up = Vec::new();
                    let mut take = Vec::new();
                    for (tp, to) in &target {
                        let from = owner.get(tp).copied();
                        if *to == m.id && from != Some(m.id) {
                            match from {
                                // Moves between live members: a second round.
                                Some(f) if live.contains(&f) => later.push((tp.clone(), *to)),
                                _ => take.push(tp.clone()),
                            }
                        } else if *to != m.id && from == Some(m.id) {
                            give_up.push(tp.clone());
                        }
                    }
                    moves.push((m, give_up, take));
                }
                // The members give their partitions up at once, each
                // waiting for its own work under way; then they take theirs.
                let revokes = moves
                    .iter()
                    .filter(|(_, give_up, _)| !give_up.is_empty())
                    .map(|(m, give_up, _)| m.inc.source.revoke(give_up, &m.inc.parts));
                futures::future::join_all(revokes).await;
                for (m, _, take) in &moves {
                    // The member that joined again is assigned (perhaps
                    // nothing): the rebalance confirms its ownership.
                    let rejoining = rejoined && in_stall(stalled, m);
                    if !take.is_empty() || rejoining {
                        m.inc.source.assign(take, &m.inc.parts);
                        m.wake
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .notify_one();
                    }
                }
                owner = target
                    .iter()
                    .filter(|(tp, _)| !later.iter().any(|(l, _)| l == *tp))
                    .map(|(tp, to)| (tp.clone(), *to))
                    .collect();
                set_rebalancing(
                    &world,
                    fleet.refuse_commits_in_rebalance && !later.is_empty(),
                );
                if !later.is_empty() {
                    steps.push((now + fleet.second_round_ms, Step::SecondRound(later)));
                }
                if let Some((_, at)) = stalled.filter(|_| rejoined) {
                    world
                        .journal
                        .with(|log| log.stalls[at].confirmed_ms = Some(now));
                    (stalled, rejoined) = (None, false);
                }
            }
            Step::Stall(i) => {
                if all_finished(sc, &world) || now >= sc.limit_ms {
                    continue;
                }
                // One stall at a time, outside any other rebalance.
                let busy = steps
                    .iter()
                    .any(|(_, s)| matches!(s, Step::Settle | Step::StopAll | Step::SecondRound(_)));
                if stalled.is_some() || busy {
                    steps.push((now + 1_000, Step::Stall(i)));
                    continue;
                }
                let (_, past_ms, which) = sc.stalls[i];
                let m = &members[which % members.len()];
                let for_ms = fleet.session_ms + past_ms;
                let from = tokio::time::Instant::now();
                m.inc.stall.set(from, from + Duration::from_millis(for_ms));
                let at = world.journal.with(|log| {
                    log.stalls.push(Stalled {
                        process: m.inc.process,
                        from_ms: now,
                        to_ms: now + for_ms,
                        expired_ms: None,
                        held: 0,
                        confirmed_ms: None,
                    });
                    log.stalls.len() - 1
                });
                stalled = Some((m.id, at));
                steps.push((now + fleet.session_ms, Step::Expire(m.id)));
                steps.push((now + for_ms + fleet.heartbeat_ms, Step::Lost(m.id)));
            }
            Step::Expire(id) => {
                let (Some(m), Some((_, at))) = (members.iter().find(|m| m.id == id), stalled)
                else {
                    continue;
                };
                m.inc.source.expel();
                let held = m.inc.source.owned().len();
                world.journal.with(|log| {
                    log.stalls[at].expired_ms = Some(now);
                    log.stalls[at].held = held;
                    log.reach.stalled_holding += u64::from(held > 0);
                });
                // The group rebalances without it.
                set_rebalancing(&world, fleet.refuse_commits_in_rebalance);
                if fleet.membership == Membership::Eager {
                    steps.push((now, Step::StopAll));
                }
                steps.push((now + fleet.heartbeat_ms, Step::Settle));
            }
            Step::Lost(id) => {
                let Some(m) = members.iter().find(|m| m.id == id) else {
                    continue;
                };
                m.inc.source.lose(&m.inc.parts).await;
                // It joins again: a rebalance.
                rejoined = true;
                let now = world.now_ms();
                set_rebalancing(&world, fleet.refuse_commits_in_rebalance);
                steps.push((now + fleet.rebalance_ms, Step::Settle));
                if fleet.membership == Membership::Eager {
                    steps.push((now + fleet.heartbeat_ms, Step::StopAll));
                }
            }
            Step::LoseCommits(age) => super::run::lose_commits(&world, age),
            Step::Edit(k) => {
                *policy.borrow_mut() = policies[k + 1].clone();
                for m in &members {
                    let after = spread.random_range(0..=EDIT_SPREAD_MS);
                    steps.push((now + after, Step::Reload(m.id, k)));
                }
            }
            Step::Reload(id, k) => {
                // A replica started since the edit read it at its start.
                // It reads the file as it is now: a later edit's, when
                // that came first (fleet seed 1192: edits 121 ms apart,
                // the older reload after the newer one put the older
                // limits back in force for good).
                if let Some(m) = members.iter().find(|m| m.id == id) {
                    m.inc.reload(k, &policy.borrow());
                }
            }
            Step::SecondRound(moves) => {
                for (tp, to) in moves {
                    // The member it was meant for may have died since: then
                    // the next settle assigns it.
                    if let Some(m) = members.iter().find(|m| m.id == to) {
                        // A settle since may have given it to that member
                        // already: an assignment callback names only the
                        // partitions a member does not hold (assigning it
                        // again restarted it under a new generation, and
                        // dropped the answers of its calls under way).
                        if m.inc.source.owned().contains(&tp) {
                            owner.insert(tp, to);
                            continue;
                        }
                        m.inc.source.assign(std::slice::from_ref(&tp), &m.inc.parts);
                        m.wake
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .notify_one();
                        owner.insert(tp, to);
                    }
                }
                set_rebalancing(&world, false);
            }
        }
    }
    // No rebalance is left under way; the last jobs finish without kills.
    while settled_ms.is_none() && world.now_ms() < sc.limit_ms {
        if all_finished(sc, &world) {
            settled_ms = Some(world.now_ms());
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // Every job is finished: what is left comes due and is read, then
    // every replica stops gracefully.
    super::run::drain_before_stop(sc, &world.broker).await;
    let mut summaries = Vec::new();
    for m in members {
        summaries.push(m.inc.stop().await);
    }
    let mut end = super::run::End::of(&summaries, &world.broker);
    end.held_slots = super::run::held_slots(sc, &world, &policy.borrow());
    let summary = summaries.into_iter().flatten().last();
    let end_ms = world.now_ms();
    let log = world.journal.with(std::mem::take);
    Outcome {
        log,
        panics: Vec::new(),
        settled_ms,
        summary,
        end_ms,
        end,
    }
}

/// Whether `m` is the member `stalled` names.
fn in_stall(stalled: Option<(u64, usize)>, m: &Member) -> bool {
    stalled.is_some_and(|(id, _)| id == m.id)
}

/// A lifecycle event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Kill,
    Join,
    Leave,
    Restart,
}

/// The next lifecycle event, by the fleet's weights, among those possible
/// with `members` replicas.
fn pick(rng: &mut StdRng, fleet: &Fleet, members: usize) -> Event {
    let l = &fleet.lifecycle;
    let mut options = vec![(Event::Kill, l.kill), (Event::Restart, l.restart)];
    if members < fleet.max_replicas {
        options.push((Event::Join, l.join));
    }
    if members > 1 {
        options.push((Event::Leave, l.leave));
    }
    let total: u32 = options.iter().map(|(_, w)| w).sum();
    assert!(total > 0, "no lifecycle event possible: {l:?}");
    let mut at = rng.random_range(0..total);
    for (event, w) in options {
        if at < w {
            return event;
        }
        at -= w;
    }
    unreachable!("the draw is below the total weight")
}

/// The members in order, by process id, for the faults that name one
/// (`Faults::replica_redis`).
fn publish(world: &super::ports::World, members: &[Member]) {
    *world.members.lock().unwrap_or_else(|p| p.into_inner()) =
        members.iter().map(|m| m.id << 32).collect();
}

fn set_rebalancing(world: &super::ports::World, on: bool) {
    world
        .broker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .rebalancing = on;
}

/// The partitions of each consumer role: the jobs topic, then every retry
/// tier together (one consumer subscribes to all the tiers).
fn roles(sc: &Scenario) -> Vec<Vec<Tp>> {
    let jobs_topic = sc.settings().kafka.topic;
    let (jobs, tiers): (Vec<Tp>, Vec<Tp>) = topic_partitions(sc)
        .into_iter()
        .partition(|(t, _)| *t == jobs_topic);
    vec![jobs, tiers]
}

fn owned_by(assignment: &BTreeMap<Tp, u64>, id: u64) -> Vec<Tp> {
    assignment
        .iter()
        .filter(|(_, o)| **o == id)
        .map(|(tp, _)| tp.clone())
        .collect()
}

/// The group's assignment over `members` (sorted ids), role by role.
/// Eager: `range`, topic by topic. Cooperative: sticky, each member keeps
/// what it holds up to its fair share, the rest goes to the least loaded.
fn assign(
    roles: &[Vec<Tp>],
    owner: &BTreeMap<Tp, u64>,
    members: &[u64],
    membership: Membership,
) -> BTreeMap<Tp, u64> {
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return out;
    }
    for parts in roles {
        match membership {
            Membership::Eager => {
                let mut by_topic: BTreeMap<&str, Vec<&Tp>> = BTreeMap::new();
                for tp in parts {
                    by_topic.entry(&tp.0).or_default().push(tp);
                }
                for tps in by_topic.values() {
                    let (n, m) = (tps.len(), members.len());
                    let mut i = 0;
                    for (k, id) in members.iter().enumerate() {
                        let take = n / m + usize::from(k < n % m);
                        for tp in &tps[i..i + take] {
                            out.insert((*tp).clone(), *id);
                        }
                        i += take;
                    }
                }
            }
            Membership::Cooperative => {
                let ceil = parts.len().div_ceil(members.len());
                let mut count: BTreeMap<u64, usize> = members.iter().map(|m| (*m, 0)).collect();
                let mut free = Vec::new();
                for tp in parts {
                    match owner.get(tp).and_then(|o| count.get_mut(o)) {
                        Some(c) if *c < ceil => {
                            *c += 1;
                            out.insert(tp.clone(), owner[tp]);
                        }
                        _ => free.push(tp.clone()),
                    }
                }
                for tp in free {
                    let (id, c) = count
                        .iter_mut()
                        .min_by_key(|(id, c)| (**c, **id))
                        .expect("members is not empty");
                    *c += 1;
                    out.insert(tp, *id);
                }
                // Even out: no member more than one above another.
                loop {
                    let (&hi, &nh) = count
                        .iter()
                        .max_by_key(|(id, c)| (**c, u64::MAX - **id))
                        .expect("members");
                    let (&lo, &nl) = count
                        .iter()
                        .min_by_key(|(id, c)| (**c, **id))
                        .expect("members");
                    if nh <= nl + 1 {
                        break;
                    }
                    let tp = out
                        .iter()
                        .filter(|(tp, o)| **o == hi && parts.contains(tp))
                        .map(|(tp, _)| tp.clone())
                        .next_back()
                        .expect("the busiest member holds a partition");
                    out.insert(tp, lo);
                    *count.get_mut(&hi).expect("hi") -= 1;
                    *count.get_mut(&lo).expect("lo") += 1;
                }
            }
        }
    }
    out
}

/// What a run cost the seller with the most calls: quota use (its calls
/// against what its rule allowed from its first call to its last, one full
/// window plus the rule's rate) and calls beyond one per job.
pub struct Cost {
    pub quota_use: f64,
    pub extra_calls: usize,
    pub jobs: usize,
    pub span_ms: u64,
}

pub fn cost(sc: &Scenario, out: &Outcome) -> Cost {
    let mut per_job: BTreeMap<usize, usize> = BTreeMap::new();
    for c in &out.log.calls {
        *per_job.entry(c.job).or_default() += 1;
    }
    let extra_calls = per_job.values().map(|n| n - 1).sum();
    let at: Vec<u64> = out.log.calls.iter().map(|c| c.at_ms).collect();
    let span_ms = match (at.iter().min(), at.iter().max()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    let rule = sc.sellers[0].rule.as_ref().expect("a limited seller");
    let rate = rule.limit as f64 / rule.period.as_secs_f64();
    let allowed = rule.limit as f64 + rate * span_ms as f64 / 1000.0;
    Cost {
        quota_use: out.log.calls.len() as f64 / allowed,
        extra_calls,
        jobs: per_job.len(),
        span_ms,
    }
}
