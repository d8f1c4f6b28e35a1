//! The invariants, judged on a run's journal. Each returns what it found
//! broken, in words that name the job, the seller and the instant.

use std::collections::BTreeMap;
use std::time::Duration;

use throttle_worker::config::OnError;
use throttle_worker::limiter::{Algorithm, Rule};

use super::journal::{Call, JobId, Reach};
use super::ports::{OutageKind, Poison, Window, GAVE_UP, REDIS_TIMEOUT};
use super::run::Outcome;
use super::scenario::Scenario;

/// Every invariant; empty when the run kept them all.
pub fn all(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut v = fleet(sc, out);
    v.extend(no_idle_slot_while_granted_waits(sc, out));
    v.extend(calls_within_concurrency(sc, out));
    v.extend(ordered_by_key(sc, out));
    v.extend(held_for_maintenance(sc, out));
    v
}

/// An arrival's instant (the store's µs) in virtual ms since the start.
fn arrival_ms(at_us: u64) -> u64 {
    at_us.saturating_sub(super::clock::EPOCH_US) / 1000
}

/// The `Retry-After` of a call the downstream answered 503 with one (a
/// planned maintenance), as the world chose it: the first outage window
/// holding the call's arrival, as `ports::SimDownstream` finds it.
fn maintenance_wait_ms(sc: &Scenario, c: &Call) -> Option<u64> {
    if c.class != "503-retry-after" {
        return None;
    }
    let (_, kind) = sc
        .faults
        .outages
        .iter()
        .find(|(w, _)| w.contains(c.at_ms))?;
    match kind {
        OutageKind::Maintenance { retry_after_s } => {
            let wait = Duration::from_secs(*retry_after_s).min(sc.faults.max_retry_after);
            Some(wait.as_millis() as u64)
        }
        _ => None,
    }
}

/// Invariant 17 (issue 53): a downstream that answered 503 with
/// `Retry-After: N` is down as a whole for N s (`worker::outage`): the
/// process that read the answer starts no call before N s have passed
/// that it decided after reading it. A success of a call that left before
/// the 503 does not end the hold (seed 1082 once showed it did). The
/// breaker gates asks: work the limiter granted to an ask begun before
/// the answer (its run, a pacer's jobs due up to
/// `worker.max_inline_delay` later) still goes out, and is not judged
/// here; seeds 40 and 134 show such calls inside the hold (open on issue
/// 53: gating runs on the breaker stalled fleets, seeds 220 and 668).
/// Judged per process (a restarted one has not read the answer),
/// so not in a fleet.
pub fn held_for_maintenance(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let log = &out.log;
    let inline = sc.settings().worker.max_inline_delay.as_millis() as u64;
    for m in &log.calls {
        let Some(wait) = maintenance_wait_ms(sc, m) else {
            continue;
        };
        let s = start_of(log, m.end_ms);
        let until = m.end_ms + wait;
        // An ask of the seller begun before the answer was read, whose
        // grant may still be going out at `at`.
        let granted_before = |seller: &str, at: u64| {
            log.asks.iter().any(|a| {
                a.seller == seller
                    && start_of(log, a.from_ms) == s
                    && a.from_ms <= m.end_ms
                    && a.to_ms.is_none_or(|to| to + inline >= at)
            })
        };
        let early = log
            .arrivals
            .iter()
            .map(|a| (a.job, a.seller.as_str(), arrival_ms(a.at_us)))
            .filter(|&(_, _, at)| at > m.end_ms && at < until && start_of(log, at) == s)
            .filter(|&(_, seller, at)| !granted_before(seller, at))
            .min_by_key(|&(_, _, at)| at);
        if let Some((job, _, at)) = early {
            return vec![format!(
                "17. job {} answered 503 with Retry-After: {} ms at {} ms, yet job {job} was called at {at} ms, before {until} ms, on a grant asked for after",
                m.job, wait, m.end_ms
            )];
        }
    }
    Vec::new()
}

/// The answered calls of each unit of order ([`Scenario::order_key`]), by
/// arrival.
fn calls_by_key<'a>(
    sc: &Scenario,
    out: &'a Outcome,
) -> BTreeMap<(usize, i32, String), Vec<&'a Call>> {
    let mut by_key: BTreeMap<(usize, i32, String), Vec<&Call>> = BTreeMap::new();
    for c in &out.log.calls {
        if let Some(k) = sc.order_key(c.job) {
            by_key.entry(k).or_default().push(c);
        }
    }
    for calls in by_key.values_mut() {
        calls.sort_by_key(|c| (c.at_ms, c.end_ms, c.job));
    }
    by_key
}

/// Instants a partition changed hands (a rebalance, a kill): a call under
/// way then may overlap its successor's (issue 53), and is excused here.
fn handoffs(sc: &Scenario, out: &Outcome) -> Vec<u64> {
    let mut at: Vec<u64> = sc.rebalances.iter().map(|r| r.0).collect();
    at.extend(out.log.kills.iter().copied());
    at.extend(sc.crashes.iter().map(|c| c.0));
    at
}

/// Invariant 15 (issue 50): two jobs of one ordering key (`worker.ordering`:
/// one product, or one seller's partition) are never at the downstream
/// together, and they first reach it in offset order. Excused: a job that
/// went round a retry tier before the later one's call (order across a
/// tier is not kept: docs/src/concepts/ordering.md), and calls on either
/// side of a handoff (a rebalance or a kill).
pub fn ordered_by_key(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let log = &out.log;
    let handoffs = handoffs(sc, out);
    let handoff_within = |from: u64, to: u64| handoffs.iter().any(|&h| from <= h && h <= to);
    let retried = &log.retry_begun;
    let mut v = Vec::new();
    for (key, calls) in calls_by_key(sc, out) {
        // The call seen so far that ends last: whatever starts before its
        // end overlaps it.
        let mut open: Option<&Call> = None;
        for &c in &calls {
            if let Some(p) = open {
                if p.job != c.job && c.at_ms < p.end_ms && !handoff_within(p.at_ms, c.at_ms) {
                    v.push(format!(
                        "15. jobs {} and {} of one ordering key {key:?} at the downstream together at {} ms ({} ms to {} ms)",
                        p.job, c.job, c.at_ms, p.at_ms, p.end_ms
                    ));
                    break;
                }
            }
            if open.is_none_or(|p| c.end_ms > p.end_ms) {
                open = Some(c);
            }
        }
        // First calls in offset order (a job's index is its offset order
        // within its partition: jobs are produced in index order).
        let mut first: BTreeMap<JobId, u64> = BTreeMap::new();
        for c in &calls {
            first.entry(c.job).or_insert(c.at_ms);
        }
        let firsts: Vec<(JobId, u64)> = first.into_iter().collect();
        'jobs: for (i, &(b, b_at)) in firsts.iter().enumerate() {
            for &(a, a_at) in &firsts[..i] {
                // `a` had left for a retry tier when `b` was called: from
                // when its copy's write began, not when it landed (seed
                // 4842: a head sent round after max_head_wait, its
                // successor called 4 ms before the copy's ack).
                let excused =
                    retried.get(&a).is_some_and(|&r| r <= b_at) || handoff_within(b_at, a_at);
                if a_at > b_at && !excused {
                    v.push(format!(
                        "15. job {b} of ordering key {key:?} reached the downstream at {b_at} ms, before job {a}, earlier in its partition, at {a_at} ms"
                    ));
                    break 'jobs;
                }
            }
        }
    }
    v
}

/// Invariant 14: one process never has more calls out at the downstream
/// than `downstream.concurrency`, whatever its adaptive limit learnt. A
/// call counts from its arrival to its answer, or to its process's end
/// when it was never answered.
pub fn calls_within_concurrency(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut steps = call_steps(&out.log);
    // Ends before starts at one instant: a slot handed over.
    steps.sort_unstable();
    let mut busy: BTreeMap<u64, i64> = BTreeMap::new();
    for (s, at, d) in steps {
        let n = busy.entry(s).or_default();
        *n += d;
        if *n > sc.concurrency as i64 {
            return vec![format!(
                "14. {n} calls out at {at} ms, over downstream.concurrency {}",
                sc.concurrency
            )];
        }
    }
    Vec::new()
}

/// The invariants of a fleet of replicas: all but invariant 4, which
/// judges one process's slots.
pub fn fleet(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    v.extend(out.panics.iter().map(|p| format!("7. panic: {p}")));
    v.extend(limits(sc, out));
    v.extend(called_after_release(sc, out));
    v.extend(nothing_lost(sc, out));
    v.extend(no_innocent_dead_letters(sc, out));
    v.extend(no_tight_loop(sc, out));
    v.extend(no_write_loop(out));
    // The journal's own checks: invariant 6 (commits), 12 (handoffs) and
    // 18 (redeliveries), the last two already numbered.
    v.extend(out.log.violations.iter().map(|c| {
        if c.starts_with("12.") || c.starts_with("18.") {
            c.clone()
        } else {
            format!("6. {c}")
        }
    }));
    v.extend(no_call_while_paused(sc, out));
    v.extend(in_flight_within_cap(sc, out));
    v.extend(nothing_left(out));
    v.extend(no_second_success_on_a_graceful_handoff(out));
    v.extend(no_call_before_ownership_is_confirmed(out));
    v
}

/// Invariant 20 (issue 53, item 2): a replica stalled past its session
/// timeout starts no call from its stall until a rebalance assigns it
/// again: the group gave its partitions to the others meanwhile, so a
/// call of one of the jobs it still holds may be the second of that job,
/// by two owners (and its `max_in_flight` leases lapsed in the stall).
/// Calls under way when it stalled may end; none may start.
pub fn no_call_before_ownership_is_confirmed(out: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    for s in &out.log.stalls {
        let until = s.confirmed_ms.unwrap_or(u64::MAX);
        let early = out
            .log
            .calls
            .iter()
            .filter(|c| c.process == s.process && (s.from_ms..until).contains(&c.at_ms));
        for c in early.take(2) {
            let others: Vec<u64> = out
                .log
                .calls
                .iter()
                .filter(|o| o.job == c.job && o.process != s.process)
                .map(|o| o.at_ms)
                .collect();
            v.push(format!(
                "20. a replica stalled from {} to {} ms (its session expired at {:?} ms) called job {} at {} ms, before a rebalance confirmed its ownership (at {:?} ms); other replicas called it at {others:?} ms",
                s.from_ms, s.to_ms, s.expired_ms, c.job, c.at_ms, s.confirmed_ms
            ));
        }
    }
    v
}

/// A job's success called again (invariant 12 is judged where a record
/// is delivered again, `Journal::delivered`; this is what the downstream
/// saw of the same thing).
pub struct Again {
    pub job: JobId,
    /// When the first success and the second call began (virtual ms).
    pub first_ms: u64,
    pub second_ms: u64,
    /// A process was killed, or a stalled one's session expired (its
    /// partitions went to the others with no handoff), before the second
    /// call.
    pub after_kill: bool,
    /// Between the first call and the second, a revoke stopped waiting
    /// for its work under way at its bound (`worker.revoke_wait`), or a
    /// graceful stop abandoned work at `worker.shutdown_timeout`: a
    /// success that landed after is not this owner's to commit.
    pub past_bound: bool,
    /// Its record, finished, was handed over by a handoff that could not
    /// carry it (invariant 12's excuse: commit refused, ledger unwritten
    /// or unread).
    pub uncarried: bool,
    /// Every earlier registration of the job was one its client gave up
    /// on (a timeout): the client never saw a success, so calling the job
    /// again is at-least-once doing its job, not a handoff's slip. Such a
    /// repeat is counted (`Reach::again_after_gave_up`), never judged
    /// against the earlier registration; a repeat after a success the
    /// client did see is judged against that one.
    pub after_gave_up: bool,
    /// Its record was delivered again because the broker lost the commit
    /// that passed it (`Journal::lost_since`): at-least-once, excused.
    pub lost_commit: bool,
}

/// Whether the downstream registered the job on this call: a success it
/// answered, or one it registered after the client had given up (a
/// timeout, `ports::GAVE_UP`), which the client never saw.
fn registered(c: &Call) -> bool {
    c.class == "2xx" || c.class == GAVE_UP
}

pub fn second_successes(out: &Outcome) -> Vec<Again> {
    let expiries = out.log.stalls.iter().filter_map(|s| s.expired_ms);
    let first_kill = out
        .log
        .kills
        .iter()
        .copied()
        .chain(expiries)
        .min()
        .unwrap_or(u64::MAX);
    let mut first: BTreeMap<JobId, &Call> = BTreeMap::new();
    // The first success each job's client saw (a 2xx): what a second
    // registration is judged against.
    let mut first_seen: BTreeMap<JobId, &Call> = BTreeMap::new();
    let mut v = Vec::new();
    let mut calls: Vec<&Call> = out.log.calls.iter().filter(|c| registered(c)).collect();
    calls.sort_by_key(|c| (c.at_ms, c.end_ms));
    for c in calls {
        let Some(&f) = first.get(&c.job) else {
            first.insert(c.job, c);
            if c.class == "2xx" {
                first_seen.insert(c.job, c);
            }
            continue;
        };
        let seen = first_seen.get(&c.job).copied();
        let f = seen.unwrap_or(f);
        let within = |at: u64| f.at_ms <= at && at <= c.at_ms;
        let log = &out.log;
        let past_bound = log.bound_passed.iter().any(|(at, _)| within(*at))
            || log.abandoned.iter().any(|at| within(*at));
        let uncarried = log.uncarried.contains(&c.job);
        v.push(Again {
            job: c.job,
            first_ms: f.at_ms,
            second_ms: c.at_ms,
            after_kill: first_kill <= c.at_ms,
            past_bound,
            uncarried,
            after_gave_up: seen.is_none(),
            lost_commit: log.dropped_by_lost_commit.contains(&c.job),
        });
        if c.class == "2xx" {
            first_seen.entry(c.job).or_insert(c);
        }
    }
    v
}

/// Invariant 16 (issue 53): a job the downstream answered with a success
/// is not called to a success again across a graceful handoff: the revoke
/// waits for the calls and writes under way on its partitions, and
/// commits what they finished. Excused: a second call after a kill, or
/// after a revoke's wait reached its bound (`worker.revoke_wait`) or a
/// graceful stop abandoned work (counted: `Reach::again_past_bound`), or
/// a handoff that could carry nothing (invariant 12's excuse), or a
/// registration the client never saw (it gave up at its timeout: counted,
/// `Reach::again_after_gave_up`).
pub fn no_second_success_on_a_graceful_handoff(out: &Outcome) -> Vec<String> {
    second_successes(out)
        .iter()
        .filter(|d| {
            !d.after_kill && !d.past_bound && !d.uncarried && !d.after_gave_up && !d.lost_commit
        })
        .take(3)
        .map(|d| {
            format!(
                "16. job {} answered 2xx at {} ms and called to a success again at {} ms, with no kill and no revoke wait cut short",
                d.job, d.first_ms, d.second_ms
            )
        })
        .collect()
}

/// Jobs the downstream answered with a success twice, with no process
/// killed before the second call (before issue 53: work under way at a
/// revoke finished after the revoke's commit, so the next owner got its
/// record again; now only past a wait's bound, invariant 16).
pub fn second_successes_without_a_kill(out: &Outcome) -> usize {
    second_successes(out)
        .iter()
        .filter(|d| !d.after_kill)
        .count()
}

/// Invariant 11: a run whose jobs all finished leaves nothing behind once
/// its leftovers came due (`run::drain_before_stop`: at most the longest
/// retry tier's delay and a minute) and every process stopped gracefully:
/// no job in any process's memory, no record parked, every partition
/// committed to its log's end (a lag of 0), every process stopped within
/// its timeout, no slot of `max_in_flight` held in Redis.
pub fn nothing_left(out: &Outcome) -> Vec<String> {
    if out.settled_ms.is_none() {
        // Invariant 2 reports what never finished.
        return Vec::new();
    }
    let e = &out.end;
    let mut v = Vec::new();
    if e.waiting > 0 || e.parked > 0 {
        v.push(format!(
            "11. every job finished, yet the graceful stop found {} jobs waiting and {} records parked",
            e.waiting, e.parked
        ));
    }
    if e.unstopped > 0 {
        v.push(format!(
            "11. {} processes did not stop gracefully within 60 s",
            e.unstopped
        ));
    }
    for (seller, held) in &e.held_slots {
        v.push(format!(
            "11. every process stopped, yet {seller} still holds {held} slots of its max_in_flight in Redis"
        ));
    }
    for ((topic, p), committed, end) in &e.behind {
        // Where a commit the broker lost left it, no owner having had a
        // record of it to finish since: an owner commits what it moved
        // (a revoke and a graceful stop also what it received and did not
        // move), and this one received nothing. Its next owner does those
        // records again, at-least-once (the commit's loss, not the
        // product's slip).
        let tp = (topic.clone(), *p);
        let lost = out.log.lost_commits.get(&tp).and_then(|l| l.last());
        let left_by_loss = lost.is_some_and(|(at, back, _)| {
            back == committed
                && !out
                    .log
                    .commits
                    .get(&tp)
                    .is_some_and(|c| c.iter().any(|(s, _)| s > at))
        });
        if left_by_loss {
            continue;
        }
        v.push(format!(
            "11. every job finished, yet {topic}/{p} is committed to {committed}, short of its end {end}"
        ));
    }
    v
}

/// How often a run reached the states that matter: what the ports
/// counted as they happened, and what the journal shows afterwards.
pub fn reach(sc: &Scenario, out: &Outcome) -> Reach {
    let log = &out.log;
    let mut r = log.reach;
    r.held_past_inline = log.retried_at.len() as u64;
    r.revoked_during_ask = sc
        .rebalances
        .iter()
        .map(|&(at, _, _)| {
            log.asks
                .iter()
                .filter(|a| a.from_ms <= at && a.to_ms.is_none_or(|to| to > at))
                .count() as u64
        })
        .sum();
    let paced =
        |seller: &str| rule_of(sc, seller).is_some_and(|r| r.algorithm() == Algorithm::LeakyBucket);
    r.paced_calls = log.arrivals.iter().filter(|a| paced(&a.seller)).count() as u64;
    r.calls_cut_by_kill = log.unanswered.len() as u64;
    r.again_without_kill = second_successes_without_a_kill(out) as u64;
    r.again_past_bound = second_successes(out)
        .iter()
        .filter(|d| !d.after_kill && d.past_bound)
        .count() as u64;
    r.again_uncarried = second_successes(out)
        .iter()
        .filter(|d| !d.after_kill && !d.past_bound && d.uncarried)
        .count() as u64;
    r.again_after_gave_up = second_successes(out)
        .iter()
        .filter(|d| !d.after_kill && !d.past_bound && !d.uncarried && d.after_gave_up)
        .count() as u64;
    let under = |c: &&Call, alg: Algorithm| {
        own_rules(sc, &c.seller)
            .iter()
            .any(|r| r.algorithm() == alg)
    };
    r.window_counter_calls = log
        .calls
        .iter()
        .filter(|c| under(c, Algorithm::SlidingWindowCounter))
        .count() as u64;
    r.burst_fill_calls = log
        .calls
        .iter()
        .filter(|c| under(c, Algorithm::BurstFill))
        .count() as u64;
    r.several_rules_calls = log
        .calls
        .iter()
        .filter(|c| own_rules(sc, &c.seller).len() > 1)
        .count() as u64;
    if !global_rules(sc).is_empty() {
        r.global_rule_calls = log
            .calls
            .iter()
            .filter(|c| !own_rules(sc, &c.seller).is_empty())
            .count() as u64;
    }
    let failures = redis_failures(sc);
    let in_failure = |at: u64| failures.iter().any(|&(from, to)| from <= at && at < to);
    let ungranted = log
        .calls
        .iter()
        .filter(|c| c.granted_at_us.is_none() && !own_rules(sc, &c.seller).is_empty())
        .filter(|c| in_failure(c.at_ms))
        .count() as u64;
    match sc.on_error {
        OnError::Local => {
            r.local_calls = ungranted;
            r.local_dropped_without_redis = log
                .limiter_answered_ms
                .iter()
                .filter(|&&t| sc.faults.redis_errors.iter().any(|w| w.contains(t)))
                .count() as u64;
        }
        OnError::FailOpen => r.fail_open_calls = ungranted,
        OnError::FailClosed => {}
    }
    r.losses_taken_for_new = losses_taken_for_new(sc, out).len() as u64;
    r.losses_unrestored = losses_unrestored(sc, out).len() as u64;
    r.gave_up_calls = log.calls.iter().filter(|c| c.class == GAVE_UP).count() as u64;
    r.maintenance_calls = log
        .calls
        .iter()
        .filter(|c| c.class == "503-retry-after")
        .count() as u64;
    r.shed_calls = log.calls.iter().filter(|c| c.class == "shed").count() as u64;
    let (side_by_side, held) = lanes_reached(sc, out);
    r.partition_side_by_side = side_by_side;
    r.key_held_while_others_ran = held;
    edits_reached(sc, out, &mut r);
    r
}

/// Shadow rules', tiers' and live edits' reach counts (issue 53 item 4).
fn edits_reached(sc: &Scenario, out: &Outcome, r: &mut Reach) {
    let worlds = sc.eras();
    let global_shadow = sc.global.iter().any(|g| g.shadow);
    let mut by_seller: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in &out.log.calls {
        by_seller.entry(&c.seller).or_default().push(c);
    }
    for (seller, calls) in by_seller {
        let Some(i) = sc.sellers.iter().position(|s| s.name == seller) else {
            continue;
        };
        if own_rules(sc, seller).is_empty() {
            continue;
        }
        let eras = Eras::of(&worlds, out, seller);
        // The era a call's arrival falls in (its first, in doubt).
        let era_at = |us: u64| {
            let before = eras.doubt.iter().filter(|&&(_, to)| to < us).count();
            &worlds[before]
        };
        for c in &calls {
            let era = era_at(c.at_us);
            if global_shadow || !shadow_rules(era, seller).is_empty() {
                r.shadow_rule_calls += 1;
            }
            if era.tier_of.contains_key(&i) {
                r.tier_calls += 1;
            }
        }
        let mut grants: Vec<(u64, u64, u64)> = calls
            .iter()
            .filter_map(|c| {
                let g = c.granted_at_us?;
                Some((g, c.cost, decided_at(&out.log, seller, g)))
            })
            .collect();
        grants.sort();
        r.calls_after_edit += grants
            .iter()
            .filter(|&&(_, _, d)| eras.at(d).is_some_and(|k| k > 0))
            .count() as u64;
        // A shadow rule that would have refused: judged as if binding, on
        // the grants of a stretch of eras that held it (judged alone).
        for (k, _) in eras.rules.iter().enumerate() {
            let Some(era) = eras.stretch.iter().position(|&s| s == k) else {
                continue;
            };
            let mine: Vec<(u64, u64)> = grants
                .iter()
                .filter(|&&(_, _, d)| eras.at(d) == Some(k))
                .map(|&(g, c, _)| (g, c))
                .collect();
            for rule in shadow_rules(&worlds[era], seller) {
                if over_rule(&rule, &mine).is_some() {
                    r.shadow_would_refuse += 1;
                }
            }
        }
    }
    // An edit a replica applied while one of its limiter calls (or
    // another replica's) was under way.
    let log = &out.log;
    r.edits_under_way += (0..sc.edits.len())
        .filter(|&k| {
            log.edits_applied.iter().any(|&(x, t)| {
                x == k
                    && log
                        .asks
                        .iter()
                        .any(|a| a.from_ms <= t && a.to_ms.is_none_or(|to| to > t))
            })
        })
        .count() as u64;
}

/// Issue 50's reach counts: calls of one seller and partition that were
/// at the downstream together (jobs of different keys side by side), and
/// jobs whose key held them (produced while an earlier job of their key
/// was out) while a job of another key of their seller started.
fn lanes_reached(sc: &Scenario, out: &Outcome) -> (u64, u64) {
    let mut by_part: BTreeMap<(usize, i32), Vec<&Call>> = BTreeMap::new();
    for c in &out.log.calls {
        let j = &sc.jobs[c.job];
        by_part.entry((j.seller, j.partition)).or_default().push(c);
    }
    let mut side_by_side = 0;
    for calls in by_part.values_mut() {
        calls.sort_by_key(|c| (c.at_ms, c.end_ms));
        let mut end = 0;
        for c in calls.iter() {
            side_by_side += u64::from(c.at_ms < end);
            end = end.max(c.end_ms);
        }
    }
    let mut held = 0;
    for (key, calls) in calls_by_key(sc, out) {
        for pair in calls.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let produced = sc.jobs[b.job].at_ms;
            if a.job == b.job || produced >= a.end_ms {
                continue;
            }
            let others_ran = by_part[&(key.0, key.1)].iter().any(|c| {
                sc.order_key(c.job).as_ref() != Some(&key)
                    && c.at_ms >= produced.max(a.at_ms)
                    && c.at_ms < a.end_ms
            });
            held += u64::from(others_ran);
        }
    }
    (side_by_side, held)
}

/// Invariant 9: a seller whose calls in flight are capped
/// (`max_in_flight`) never has more under way at once at the downstream,
/// across the fleet. Judged on answered calls (a killed process's calls
/// are never answered, and their slots lapse with their lease).
///
/// Under `redis.on_error = "local"` or `"fail_open"` a call admitted while
/// Redis fails holds no slot in Redis (the replica holds the seller to its
/// share of the cap, less its calls under way), so once Redis answers
/// again it grants slots beside calls still out: the docs promise the
/// fleet stays near the cap, not at it. There the cap is judged on the
/// calls that started outside Redis' failures (`redis_failures`), each of
/// which held a slot, and at each call admitted without Redis (a limited
/// seller's call with no grant), on every call of the seller out then,
/// its own included: the replica's share of a single process is the whole
/// cap. `fail_closed` judges every call.
pub fn in_flight_within_cap(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    let failures = redis_failures(sc);
    let slotted = |c: &Call| {
        sc.on_error == OnError::FailClosed
            || !failures
                .iter()
                .any(|&(from, to)| from <= c.at_ms && c.at_ms < to)
    };
    for spec in &sc.sellers {
        let Some(cap) = spec.max_in_flight else {
            continue;
        };
        if sc.on_error != OnError::FailClosed && spec.rule.is_some() {
            let mine: Vec<&Call> = out
                .log
                .calls
                .iter()
                .filter(|c| c.seller == spec.name)
                .collect();
            let unslotted = mine
                .iter()
                .filter(|c| c.granted_at_us.is_none() && !slotted(c));
            for c in unslotted {
                // Out at its start: begun by then, not ended before.
                let out_then = mine
                    .iter()
                    .filter(|o| o.at_ms <= c.at_ms && o.end_ms > c.at_ms)
                    .count();
                if out_then > cap as usize {
                    v.push(format!(
                        "9. {}: job {} admitted without Redis at {} ms with {out_then} calls out, over its max_in_flight {cap}",
                        spec.name, c.job, c.at_ms
                    ));
                    break;
                }
            }
        }
        let (most, at) = most_in_flight_of(out, &spec.name, slotted);
        if most > i64::from(cap) {
            v.push(format!(
                "9. {}: {most} calls in flight at {at} ms, over its max_in_flight {cap}",
                spec.name
            ));
        }
    }
    v
}

/// Most calls of `seller` under way at once at the downstream (answered
/// calls), and the first instant (virtual ms) with that many.
pub fn most_in_flight(out: &Outcome, seller: &str) -> (i64, u64) {
    most_in_flight_of(out, seller, |_| true)
}

/// As [`most_in_flight`], counting only the calls `counted` keeps.
fn most_in_flight_of(out: &Outcome, seller: &str, counted: impl Fn(&Call) -> bool) -> (i64, u64) {
    // (instant, +1 start / -1 end): ends first at one instant.
    let mut steps: Vec<(u64, i64)> = Vec::new();
    for c in out
        .log
        .calls
        .iter()
        .filter(|c| c.seller == seller && counted(c))
    {
        steps.push((c.at_ms, 1));
        steps.push((c.end_ms, -1));
    }
    steps.sort_unstable();
    let (mut now, mut most, mut most_at) = (0i64, 0i64, 0u64);
    for (at, d) in steps {
        now += d;
        if now > most {
            (most, most_at) = (now, at);
        }
    }
    (most, most_at)
}

/// Invariant 8: no call of a paused seller reaches the downstream while
/// its pause (or the fleet's) lasts. A call under way when the pause began
/// may finish; none may start.
pub fn no_call_while_paused(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    for c in &out.log.calls {
        for (w, who, _) in &sc.faults.pauses {
            let held = who.as_deref().is_none_or(|s| s == c.seller);
            if held && w.contains(c.at_ms) {
                v.push(format!(
                    "8. {}: job {} called at {} ms, inside its pause {}..{} ms",
                    c.seller, c.job, c.at_ms, w.from_ms, w.to_ms
                ));
            }
        }
    }
    v
}

fn rule_of(sc: &Scenario, seller: &str) -> Option<Rule> {
    let spec = sc.sellers.iter().find(|s| s.name == seller)?;
    let r = spec.rule.as_ref()?;
    let alg: Algorithm = r.algorithm.parse().ok()?;
    Rule::new(alg, r.limit, r.period, r.burst).ok()
}

/// A seller's own rules as the policy holds them (its drawn rule and
/// those held with it); none for an unlimited seller.
fn own_rules(sc: &Scenario, seller: &str) -> Vec<Rule> {
    let Some(i) = sc.sellers.iter().position(|s| s.name == seller) else {
        return Vec::new();
    };
    built(&sc.rules_of(i))
}

/// The global rules (`limits.global`), over every limited seller.
fn global_rules(sc: &Scenario) -> Vec<Rule> {
    built(&sc.global)
}

/// A seller's own shadow rules (`shadow = true`): decided and counted,
/// never binding, so never judged as binding; the reach counts look at
/// them.
fn shadow_rules(sc: &Scenario, seller: &str) -> Vec<Rule> {
    let Some(i) = sc.sellers.iter().position(|s| s.name == seller) else {
        return Vec::new();
    };
    sc.rules_of(i)
        .iter()
        .filter(|r| r.shadow)
        .filter_map(|r| Rule::new(r.algorithm.parse().ok()?, r.limit, r.period, r.burst).ok())
        .collect()
}

/// A seller's rules across the live edits of `[limits]`
/// (`Scenario::edits`), as invariant 1 judges them.
///
/// What the product promises across an edit (`worker::reload`,
/// `Limiter::set_policy`; the book's "Changing limits without a restart"
/// and "Limiter state", Edits): a valid edit swaps the limiter's policy at
/// once; a limiter call under way finishes with the old policy, the next
/// one uses the new. So a grant decided before a replica reloaded was
/// decided under the old rules, and one decided after every replica
/// reloaded (a fleet's replicas each see the edit up to `EDIT_SPREAD_MS`
/// apart) and after every limiter call of the seller under way meanwhile
/// had answered, under the new rules. Between the two (the edit's window
/// of doubt) a grant may be either. The state a rule left at its place is
/// converted for the new rule, never admitting on top of what the old one
/// admitted (`lua/common.lua`, `settle`): so the grants of each era,
/// judged alone, keep that era's rules (a seller whose rules an edit left
/// as they were is judged across it as one era). Across an edit, a window
/// of `fixed_window` or `sliding_window_log` whose place keeps its
/// algorithm and period admits at most the larger of the two limits: the
/// grants on both sides and in doubt are judged against that. Other
/// pairs (a bucket's new rate, another algorithm, a rule made enforced
/// from shadow, whose shadow state followed only what it would have
/// admitted) are judged on each side alone.
struct Eras {
    /// Each stretch of eras over which the seller's enforced rules stay
    /// the same: those rules.
    rules: Vec<Vec<Rule>>,
    /// Each era's stretch.
    stretch: Vec<usize>,
    /// Each edit's window of doubt (µs, the limiter's clock), inclusive.
    doubt: Vec<(u64, u64)>,
}

impl Eras {
    fn of(eras: &[Scenario], out: &Outcome, seller: &str) -> Eras {
        let mut rules: Vec<Vec<Rule>> = Vec::new();
        let mut stretch = Vec::new();
        for era in eras {
            let own = own_rules(era, seller);
            if rules.last() != Some(&own) {
                rules.push(own);
            }
            stretch.push(rules.len() - 1);
        }
        let doubt = eras[0]
            .edits
            .iter()
            .enumerate()
            .map(|(k, e)| {
                let (from, to) = doubt_ms(out, k, e.at_ms, Some(seller));
                (
                    super::clock::EPOCH_US + from * 1_000,
                    super::clock::EPOCH_US + (to + 1) * 1_000,
                )
            })
            .collect();
        Eras {
            rules,
            stretch,
            doubt,
        }
    }

    /// The stretches a grant decided at `us` may belong to: (first, last).
    fn span(&self, us: u64) -> (usize, usize) {
        let lo = self.doubt.iter().filter(|&&(_, to)| to < us).count();
        let hi = self.doubt.iter().filter(|&&(from, _)| from <= us).count();
        (self.stretch[lo], self.stretch[hi])
    }

    /// The stretch whose rules a grant decided at `us` is judged by; none
    /// when it is in doubt between two.
    fn at(&self, us: u64) -> Option<usize> {
        let (lo, hi) = self.span(us);
        (lo == hi).then_some(lo)
    }
}

/// Edit `k`'s window of doubt (virtual ms, inclusive): from the file's
/// change to the last replica's reload and the end of every limiter call
/// (of `seller`, or of anyone) under way in between.
fn doubt_ms(out: &Outcome, k: usize, at_ms: u64, seller: Option<&str>) -> (u64, u64) {
    let last = out
        .log
        .edits_applied
        .iter()
        .filter(|&&(e, _)| e == k)
        .map(|&(_, at)| at)
        .max()
        .unwrap_or(at_ms)
        .max(at_ms);
    let to = out
        .log
        .asks
        .iter()
        .filter(|a| seller.is_none_or(|s| a.seller == s))
        .filter(|a| a.from_ms <= last && a.to_ms.is_none_or(|to| to >= at_ms))
        .map(|a| a.to_ms.unwrap_or(last))
        .max()
        .unwrap_or(last)
        .max(last);
    (at_ms, to)
}

/// Whether a window's count at one place carries across an edit from `a`
/// to `b`: both `fixed_window` or both `sliding_window_log`, of one
/// period (the book's "Limiter state", Edits: kept).
fn kept_across(a: &Rule, b: &Rule) -> Option<Rule> {
    let window = matches!(
        a.algorithm(),
        Algorithm::FixedWindow | Algorithm::SlidingWindowLog
    );
    (window && a.algorithm() == b.algorithm() && a.period() == b.period())
        .then(|| {
            Rule::new(
                a.algorithm(),
                a.limit().get().max(b.limit().get()),
                a.period(),
                None,
            )
            .ok()
        })
        .flatten()
}

/// The rules of a list that hold calls: a shadow rule never does.
fn built(rules: &[throttle_worker::config::RuleConfig]) -> Vec<Rule> {
    rules
        .iter()
        .filter(|r| !r.shadow)
        .filter_map(|r| Rule::new(r.algorithm.parse().ok()?, r.limit, r.period, r.burst).ok())
        .collect()
}

/// Invariant 1: no seller's calls exceed any of its rules, and the calls
/// of every limited seller together exceed no global rule, each judged by
/// the rule's definition on the grants' instants (`X-Granted-At`, the
/// limiter's clock): each call spends its own grant, so a call without
/// one, or two calls on one, show.
/// It is also the invariant of limits learnt from 429s (`limits.learn`, a
/// third of the seeds): judged on the configured rules, a learnt rule that
/// ever let more through than the configured one would show here.
pub fn limits(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut by_seller: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in &out.log.calls {
        by_seller.entry(&c.seller).or_default().push(c);
    }
    let mut v = Vec::new();
    let mut unguarded: Vec<u64> = losses_taken_for_new(sc, out)
        .into_iter()
        .chain(losses_unrestored(sc, out))
        .map(|ms| super::clock::EPOCH_US + ms * 1_000)
        .collect();
    unguarded.sort_unstable();
    unguarded.dedup();
    let episodes = redis_failures(sc);
    let episode_of = |at_ms: u64| {
        episodes
            .iter()
            .position(|&(from, to)| from <= at_ms && at_ms < to)
    };
    // What `local` counts lives in one process's memory, and is dropped
    // whenever its limiter decides again (`worker::admission`): a call
    // admitted locally belongs to the span of its failure, its process and
    // the limiter's last decision before it.
    let log = &out.log;
    // It counts on the host's wall clock, so a step of that clock starts
    // its time over too (reported on issue 53: a step forward in a failure
    // lets `local` admit anew): a span ends at each step, and within one
    // the admissions are judged at the host's instants (its windows align
    // on that clock).
    let local_key = |e: usize, at_ms: u64| {
        let last = log
            .limiter_answered_ms
            .iter()
            .chain(sc.clock_jumps.iter().map(|(at, _)| at))
            .copied()
            .filter(|&t| episodes[e].0 <= t && t < at_ms)
            .max();
        (e, start_of(log, at_ms), last)
    };
    // To the µs: virtual time moves in µs (a pacer's interval of 62.5 ms,
    // a refusal's wait), and a call's ms, truncated, can put two
    // admissions up to a ms closer than `local` made them.
    let host_us = |c: &Call| {
        let skew: i64 = sc
            .clock_jumps
            .iter()
            .filter(|&&(at, _)| at <= c.at_ms)
            .map(|&(_, by)| by)
            .sum();
        c.at_us.saturating_add_signed(skew)
    };
    // Under `local`: each episode's admissions without Redis, by seller
    // (µs, cost), and every limited seller's together for the global rules.
    type Span = (usize, u64, Option<u64>);
    // A span, a seller and the stretch of its rules (`Eras`).
    type LocalKey<'a> = (Span, &'a str, usize);
    let mut local: BTreeMap<LocalKey, Vec<(u64, u64)>> = BTreeMap::new();
    let mut local_all: BTreeMap<Span, Vec<(u64, u64)>> = BTreeMap::new();
    // Every limited seller's grants, for the global rules.
    let mut all: Vec<(u64, u64, u64)> = Vec::new();
    let worlds = sc.eras();
    let mut eras_of: BTreeMap<&str, Eras> = BTreeMap::new();
    for (seller, calls) in by_seller {
        let rules = own_rules(sc, seller);
        if rules.is_empty() {
            continue;
        }
        let eras = eras_of
            .entry(seller)
            .or_insert_with(|| Eras::of(&worlds, out, seller));
        // (µs, cost, when decided: where it falls among the losses).
        let mut grants: Vec<(u64, u64, u64)> = Vec::new();
        for c in calls {
            match (c.granted_at_us, sc.on_error, episode_of(c.at_ms)) {
                (Some(g), _, _) => grants.push((g, c.cost, decided_at(log, seller, g))),
                // Admitted without Redis while it failed, as the mode says.
                (None, OnError::FailOpen, Some(_)) => {}
                (None, OnError::Local, Some(e)) => {
                    let at = host_us(c);
                    let span = local_key(e, c.at_ms);
                    // Its seller's rules of the moment (none judged in an
                    // edit's window of doubt).
                    if let Some(k) = eras.at(c.at_us) {
                        local
                            .entry((span, seller, k))
                            .or_default()
                            .push((at, c.cost));
                    }
                    local_all.entry(span).or_default().push((at, c.cost));
                }
                (None, _, _) => v.push(format!(
                    "1. {seller}: job {} called at {} ms without a grant{}",
                    c.job,
                    c.at_ms,
                    if sc.on_error == OnError::FailClosed {
                        ""
                    } else {
                        " while Redis answered"
                    }
                )),
            }
        }
        grants.sort();
        // Each stretch of its rules alone (see `Eras`).
        for (k, rules) in eras.rules.iter().enumerate() {
            let mine: Vec<(u64, u64, u64)> = grants
                .iter()
                .copied()
                .filter(|&(_, _, decided)| eras.at(decided) == Some(k))
                .collect();
            let after = if k > 0 {
                format!(", its rules after a live edit ({})", k)
            } else {
                String::new()
            };
            for part in split_at(&mine, &unguarded) {
                for rule in rules {
                    if let Some(e) = over_rule(rule, &part) {
                        v.push(format!("1. {seller} ({rule:?}{after}): {e}"));
                    }
                }
            }
        }
        // Across each edit that changed them: a window whose count is kept
        // admits at most the larger limit.
        for k in 1..eras.rules.len() {
            let both: Vec<(u64, u64, u64)> = grants
                .iter()
                .copied()
                .filter(|&(_, _, decided)| {
                    let (lo, hi) = eras.span(decided);
                    lo + 1 >= k && hi <= k
                })
                .collect();
            for (a, b) in eras.rules[k - 1].iter().zip(&eras.rules[k]) {
                let Some(larger) = kept_across(a, b) else {
                    continue;
                };
                for part in split_at(&both, &unguarded) {
                    if let Some(e) = over_rule(&larger, &part) {
                        v.push(format!(
                            "1. {seller} across a live edit from {a:?} to {b:?}: {e}"
                        ));
                    }
                }
            }
        }
        all.extend(grants);
    }
    all.sort();
    for part in split_at(&all, &unguarded) {
        for rule in &global_rules(sc) {
            if let Some(e) = over_rule(rule, &part) {
                v.push(format!("1. every seller together (global {rule:?}): {e}"));
            }
        }
    }
    // `local` holds what it admits in memory to every rule (a single
    // replica's share is the whole: it holds every partition, fewer in a
    // rebalance); its state starts empty at each failure, in each process
    // and at each decision of its limiter, so each span's admissions are
    // judged alone, at the instant they reached the downstream. A pacer is
    // not paced locally: its rule is judged as the bucket it is (`burst`
    // plus the rate over the span).
    //
    // Reported on issue 53, not excused silently: a decision the limiter
    // makes without Redis (a job over its rules' capacity, `Never`) is
    // taken for Redis answering again, and drops the local counts in the
    // middle of a failure: seller-0 of seed 34 is admitted 11 times in
    // 150 ms under sliding_window_log 7/1s. Counted as
    // `Reach::local_dropped_without_redis`.
    for (((e, _, _), seller, k), mut calls) in local {
        calls.sort();
        for rule in eras_of.get(seller).map_or(&[][..], |r| &r.rules[k][..]) {
            if let Some(broken) = over_rule(&unpaced(*rule), &calls) {
                v.push(format!(
                    "1. {seller} ({rule:?}) admitted locally in Redis' failure {}..{} ms: {broken}",
                    episodes[e].0, episodes[e].1
                ));
            }
        }
    }
    for ((e, _, _), mut calls) in local_all {
        calls.sort();
        for rule in &global_rules(sc) {
            if let Some(broken) = over_rule(rule, &calls) {
                v.push(format!(
                    "1. every seller together (global {rule:?}) admitted locally in Redis' failure {}..{} ms: {broken}",
                    episodes[e].0, episodes[e].1
                ));
            }
        }
    }
    v
}

/// Losses of Redis' data (virtual ms) after a charging call that the first
/// call after them took for a new install, so that nothing guarded what was
/// admitted before them. A first deploy's replica reads a missing epoch as
/// "never lost" until its own first charging call; right before that call
/// it reads the group's commits again and commits its start positions
/// (`Limiter::set_install_check`), so a replica that starts or looks after
/// another one's first call reads the install as begun. Before that check
/// (seed 2639 of the fleets: one replica granted a unit at 1,048 ms, Redis
/// lost its data at 1,097 ms, and another replica's first call at 1,169 ms
/// wrote the epoch as a new install's: 6 more under 6 per 5 s), 12 of
/// 2,000 worlds and 16 of 2,000 fleets showed it. What is left is the
/// check's own window: a loss between another replica's read of the
/// commits and its call. The grants on each side of such a loss are judged
/// alone, each against the whole rule, and the losses are counted
/// (`Reach::losses_taken_for_new`). A loss before any charging call lost
/// nothing, and is not counted.
pub fn losses_taken_for_new(sc: &Scenario, out: &Outcome) -> Vec<u64> {
    let written = &out.log.epochs_written;
    let mut losses: Vec<u64> = sc
        .faults
        .state_losses
        .iter()
        .copied()
        .filter(|&lost| written.iter().any(|&(at, _)| at < lost))
        .filter(|&lost| {
            written
                .iter()
                .find(|&&(at, _)| at >= lost)
                .is_some_and(|&(_, new)| new)
        })
        .collect();
    losses.sort_unstable();
    losses
}

/// Losses of Redis' data, whole or partial (virtual ms), after which the
/// replicas could not write back every grant that still counted: a process that granted
/// in the longest rule's period before the loss ended (killed, or stopped)
/// before the loss's hold was over (`redis.state_loss_wait` and a watch's
/// turn), so its grants, kept in its memory, went with it; or Redis
/// failed within the hold, so a restore may not have landed. With every
/// replica alive and Redis answering, a loss is judged across: the
/// restores must put back what the fleet granted before it
/// (`limiter::restore`). The grants on each side of the others are judged
/// alone, each against the whole rule, and the losses are counted
/// (`Reach::losses_unrestored`).
pub fn losses_unrestored(sc: &Scenario, out: &Outcome) -> Vec<u64> {
    let settings = sc.settings();
    let Some(wait) = settings.redis.state_loss_wait else {
        return Vec::new();
    };
    // The hold, a watch's turn (at most 1 s) and a Redis timeout.
    let hold_ms = wait.as_millis() as u64 + 2_000;
    let eras = sc.eras();
    let period_ms = eras
        .iter()
        .flat_map(|era| (0..era.sellers.len()).flat_map(|i| built(&era.rules_of(i))))
        .chain(global_rules(sc))
        .map(|r| r.period().as_millis() as u64)
        .max()
        .unwrap_or(0);
    let failures = redis_failures(sc);
    let mut losses: Vec<u64> = sc
        .faults
        .state_losses
        .iter()
        .copied()
        .chain(sc.faults.rollbacks.iter().map(|&(at, _)| at))
        .chain(sc.faults.failovers.iter().map(|&(at, _)| at))
        .filter(|&lost| {
            let ended = out
                .log
                .ends
                .iter()
                .any(|&e| e + period_ms >= lost && e < lost + hold_ms);
            let failed = failures
                .iter()
                .any(|&(from, to)| from < lost + hold_ms && to + period_ms >= lost);
            ended || failed
        })
        .collect();
    losses.sort_unstable();
    losses
}

/// `grants` ((µs, cost, µs decided), sorted) cut at each of `at` (µs,
/// sorted) by when each was decided: (µs, cost) of those decided before
/// the first cut, between each two, and after the last, each sorted.
fn split_at(grants: &[(u64, u64, u64)], at: &[u64]) -> Vec<Vec<(u64, u64)>> {
    let mut parts = vec![Vec::new(); at.len() + 1];
    for &(g, c, decided) in grants {
        parts[at.partition_point(|&cut| cut <= decided)].push((g, c));
    }
    parts
}

/// When the grant a call of `seller` carried (`X-Granted-At`, µs) was
/// decided: a paced unit's go-at is its slot in its grant's run, up to
/// `burst` intervals after the decision (seed 4839: a unit decided before
/// an unguarded loss went after it, and was judged with the fresh
/// state's grants, which could not know it); any other grant's instant
/// is its decision.
fn decided_at(log: &super::journal::Log, seller: &str, g: u64) -> u64 {
    log.paced
        .get(seller)
        .into_iter()
        .flatten()
        .filter(|&&(first, iv, units, _)| {
            iv > 0 && g >= first && (g - first) % iv == 0 && (g - first) / iv < units
        })
        .map(|&(_, _, _, decided)| decided)
        .min()
        .unwrap_or(g)
}

/// A pacer's rule read as the bucket it is, unpaced (as `local` holds it).
fn unpaced(rule: Rule) -> Rule {
    if rule.algorithm() != Algorithm::LeakyBucket {
        return rule;
    }
    Rule::new(
        Algorithm::Gcra,
        rule.limit().get(),
        rule.period(),
        Some(rule.burst().get()),
    )
    .unwrap_or(rule)
}

/// Spans of virtual ms (from, to) in which a limiter call may fail: Redis'
/// error and hang windows, each extended by `redis.timeout` and a second
/// (a call begun inside fails up to its timeout later, and its jobs go
/// then), overlapping ones merged. Under `fail_open` and `local` the jobs
/// of a failed call are admitted without Redis, so only within these.
pub fn redis_failures(sc: &Scenario) -> Vec<(u64, u64)> {
    let late = sc.settings().redis.timeout.as_millis() as u64 + 1_000;
    let mut spans: Vec<(u64, u64)> = sc
        .faults
        .redis_errors
        .iter()
        .chain(&sc.faults.redis_hangs)
        .chain(sc.faults.replica_redis.iter().map(|(w, _, _)| w))
        .chain(slow_past_timeout(sc))
        .map(|w| (w.from_ms, w.to_ms + late))
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (from, to) in spans {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

/// The windows of a slow Redis whose round trips can outlast the
/// limiter's timeout (`REDIS_TIMEOUT`): a call in one may fail.
pub fn slow_past_timeout(sc: &Scenario) -> impl Iterator<Item = &Window> {
    let timeout_us = REDIS_TIMEOUT.as_micros() as u64;
    let base_us = sc.faults.redis_latency_us.1;
    sc.faults
        .redis_slow
        .iter()
        .filter(move |(_, (_, hi))| base_us + 2 * hi * 1_000 >= timeout_us)
        .map(|(w, _)| w)
}

/// Invariant 10, judged at the downstream: every call spends units the
/// limiter released, each once, and reaches the downstream no earlier than
/// they were free to go. The store records each charged grant (its units,
/// the first free to go at its go-at, a pacer's one interval apart); the
/// downstream records each call as it arrives, answered or cut short by a
/// kill. A call names its grant by `X-Granted-At`, the instant of its first
/// unit, and takes `cost` units from there (a pacer's one interval apart)
/// out of what the store released: a call the store never granted, a unit
/// spent twice, or a paced job sent before its go-at all show here, where
/// invariant 1 trusted the engine's header.
///
/// Judged under every `redis.on_error`: what `local` and `fail_open`
/// admit without the store carries no header, and is not judged here
/// (invariant 1 judges where it may be); a call that names a grant spends
/// what the store released whatever the mode.
pub fn called_after_release(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut units: BTreeMap<&str, BTreeMap<u64, u64>> = BTreeMap::new();
    for r in &out.log.released {
        let at = units.entry(&r.seller).or_default();
        for i in 0..r.units {
            *at.entry(r.first_us + i * r.interval_us).or_default() += 1;
        }
    }
    let interval = |seller: &str| {
        rule_of(sc, seller)
            .and_then(|r| r.pace_interval_us())
            .unwrap_or(0)
    };
    let mut v = Vec::new();
    for a in &out.log.arrivals {
        let Some(g) = a.granted_at_us else {
            continue;
        };
        if a.at_us < g {
            v.push(format!(
                "10. {}: job {} reached the downstream at {} µs, {} µs before the limiter let it go",
                a.seller,
                a.job,
                a.at_us,
                g - a.at_us
            ));
        }
        let iv = interval(&a.seller);
        let left = units.entry(&a.seller).or_default();
        for i in 0..a.cost {
            let at = g + i * iv;
            match left.get_mut(&at) {
                Some(n) if *n > 0 => *n -= 1,
                _ => {
                    v.push(format!(
                        "10. {}: job {} spends a unit at {at} µs that the limiter never released, or another call spent",
                        a.seller, a.job
                    ));
                    break;
                }
            }
        }
    }
    v
}

/// The first breach of `rule` by `grants` ((µs, cost), sorted), if any.
pub fn over_rule(rule: &Rule, grants: &[(u64, u64)]) -> Option<String> {
    let period = rule.period().as_micros() as u64;
    let limit = rule.limit().get();
    match rule.algorithm() {
        Algorithm::FixedWindow => {
            let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
            for &(g, c) in grants {
                *windows.entry(g / period).or_default() += c;
            }
            windows
                .into_iter()
                .find(|&(_, n)| n > limit)
                .map(|(w, n)| format!("{n} units in the window starting at {} µs", w * period))
        }
        Algorithm::SlidingWindowLog => {
            for (j, &(gj, _)) in grants.iter().enumerate() {
                let n: u64 = grants[..=j]
                    .iter()
                    .filter(|&&(g, _)| g + period > gj)
                    .map(|&(_, c)| c)
                    .sum();
                if n > limit {
                    return Some(format!("{n} units in the period ending at {gj} µs"));
                }
            }
            None
        }
        Algorithm::LeakyBucket => {
            // A pacer: a call's grant is its first unit's go-at, and its
            // units leave one interval apart, so the next call's first unit
            // comes `cost` intervals later. A grant's interval is rounded
            // up to the µs (`Pace::interval_us`): its unit k goes up to k µs
            // late (k < 64, a batch), so the next grant's first unit may be
            // that much closer, plus a µs of rounding per call.
            let rate = limit as f64 / period as f64;
            for i in 0..grants.len() {
                let mut n = 0u64;
                for j in i + 1..grants.len() {
                    n += grants[j - 1].1;
                    let span = (grants[j].0 - grants[i].0 + 64 + 2 * (j - i) as u64) as f64;
                    if n as f64 > span * rate + 1e-6 {
                        return Some(format!(
                            "{n} units paced between {} and {} µs, {:.2} intervals apart",
                            grants[i].0,
                            grants[j].0,
                            span * rate
                        ));
                    }
                }
            }
            None
        }
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let burst = rule.burst().get() as f64;
            for i in 0..grants.len() {
                let mut n = 0u64;
                for &(gj, c) in &grants[i..] {
                    n += c;
                    let span = (gj - grants[i].0) as f64;
                    let allowed = burst + span * limit as f64 / period as f64 + 1e-6;
                    if n as f64 > allowed {
                        return Some(format!(
                            "{n} units between {} and {gj} µs, allowed {allowed:.2}",
                            grants[i].0
                        ));
                    }
                }
            }
            None
        }
        Algorithm::SlidingWindowCounter => {
            // `lua/sliding_window_counter.lua`'s own definition, in exact
            // integers on the call log: a grant at `g`, in the window
            // starting at `w`, `e` into it, keeps
            // prev * (period - e) + cur * period <= limit * period, where
            // `cur` counts the window's units up to and with this grant
            // and `prev` the previous window's. The store counts every
            // take, refunded ones until their refund; the call log only
            // the units called, so its counts are never above the store's.
            let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
            for &(g, c) in grants {
                let w = g / period;
                let cur = windows.entry(w).or_default();
                *cur += c;
                let cur = *cur;
                let prev = w.checked_sub(1).and_then(|p| windows.get(&p)).copied();
                let e = g - w * period;
                let weighted = u128::from(prev.unwrap_or(0)) * u128::from(period - e)
                    + u128::from(cur) * u128::from(period);
                if weighted > u128::from(limit) * u128::from(period) {
                    return Some(format!(
                        "{cur} units in the window starting at {} µs and {} in the one before, {e} µs into it",
                        w * period,
                        prev.unwrap_or(0)
                    ));
                }
            }
            None
        }
        Algorithm::BurstFill => {
            // A period starts at a take and holds `limit` units; the next
            // starts at the first take after it ends. The call log cannot
            // show where a period began when its first take was refunded
            // (a partial refund keeps the period open), so what is judged
            // is what every placement of the periods keeps: a span shorter
            // than one period meets at most two of them, so at most
            // 2 * limit units (`lua/burst_fill.lua`: "the tail of one
            // period's tokens and the whole of the next").
            for i in 0..grants.len() {
                let n: u64 = grants[i..]
                    .iter()
                    .take_while(|&&(g, _)| g < grants[i].0 + period)
                    .map(|&(_, c)| c)
                    .sum();
                if n > 2 * limit {
                    return Some(format!(
                        "{n} units in the period from {} µs, over twice the limit",
                        grants[i].0
                    ));
                }
            }
            None
        }
    }
}

/// The most one job of `seller` may cost: the least capacity of its own
/// rules and the global ones; none (unlimited) when it has no rule. Of
/// its rules in any era of the run (`Scenario::edits`): a job may be
/// refused for good under the limits of the moment.
fn capacity(sc: &Scenario, seller: usize) -> Option<u64> {
    sc.eras()
        .iter()
        .filter_map(|era| {
            let own = own_rules(era, &era.sellers[seller].name);
            if own.is_empty() {
                return None;
            }
            own.iter()
                .chain(&global_rules(era))
                .map(|r| r.capacity())
                .min()
        })
        .min()
}

/// Invariant 2: nothing is lost: once the run settles, every job is done or
/// dead-lettered.
pub fn nothing_lost(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    for (j, _) in sc.jobs.iter().enumerate() {
        let done = out.log.done.contains_key(&j);
        let dead = out.log.dead.iter().any(|(d, _)| *d == j);
        if !done && !dead {
            v.push(format!(
                "2. job {j} neither done nor dead-lettered after {} ms",
                out.end_ms
            ));
        }
    }
    v
}

/// Invariant 3: no valid job is dead-lettered for a fault that is not its own.
pub fn no_innocent_dead_letters(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    for (j, reason) in &out.log.dead {
        let Some(spec) = sc.jobs.get(*j) else {
            v.push(format!("3. a dead letter of no job: {reason}"));
            continue;
        };
        let own_fault = spec.malformed
            || spec.pad > sc.settings().worker.max_payload_bytes
            || spec.poison != Poison::None
            || capacity(sc, spec.seller).is_some_and(|cap| spec.cost > cap);
        if !own_fault {
            v.push(format!("3. job {j} (valid) dead-lettered: {reason}"));
        }
    }
    v
}

/// Invariant 4: no downstream slot sits idle while a granted job waits for
/// one. A call that reached the downstream later than its grant (for a
/// pacer, the instant its unit may go) waited for a slot: from then until it
/// went, every slot of its process must have been busy with a call or a
/// limiter call under way (an ask holds a slot per job it asks about).
///
/// The process (its start) a virtual instant belongs to.
fn start_of(log: &super::journal::Log, t: u64) -> u64 {
    log.starts
        .iter()
        .copied()
        .filter(|&s| s <= t)
        .max()
        .unwrap_or(0)
}

/// Calls out at the downstream as a step function, per process: (its
/// start, ms, +1 or -1). A call never answered is out until its process
/// ends (the next start).
fn call_steps(log: &super::journal::Log) -> Vec<(u64, u64, i64)> {
    let mut steps: Vec<(u64, u64, i64)> = Vec::new();
    for c in &log.calls {
        let s = start_of(log, c.at_ms);
        steps.push((s, c.at_ms, 1));
        steps.push((s, c.end_ms, -1));
    }
    for &(_, at_ms) in log.unanswered.values() {
        steps.push((start_of(log, at_ms), at_ms, 1));
    }
    steps
}

/// A call holds its slot from the instant it reached the downstream,
/// whether or not it was answered: one under way when its process was
/// killed (a downstream that times out holds each call 10 s) is in
/// `unanswered`, not in `calls`, and holds its slot until the kill, as an
/// ask the kill cut short does. Counted only from `calls`, such a slot
/// looked idle (seeds 31205 and 32258 after a timeout outage: "2 of 3
/// slots busy" while the third was a cut call's). It is not left out
/// for the breaker or any other hold: a slot is idle only when no call
/// and no ask is on it, and a granted job waiting then is the engine's
/// fault.
pub fn no_idle_slot_while_granted_waits(sc: &Scenario, out: &Outcome) -> Vec<String> {
    // Virtual time is exact; a millisecond covers the µs → ms rounding.
    const SLACK_MS: u64 = 1;
    let log = &out.log;
    let start_of = |t: u64| start_of(log, t);
    // Slots in use as a step function: (ms, +/- slots), per process start:
    // the calls', and each ask's.
    let mut steps = call_steps(log);
    for a in &log.asks {
        let s = start_of(a.from_ms);
        steps.push((s, a.from_ms, a.jobs as i64));
        if let Some(to) = a.to_ms {
            steps.push((s, to, -(a.jobs as i64)));
        }
    }
    steps.sort_by_key(|&(s, t, d)| (s, t, d));
    // The least busy the slots of the process started at `s` were within
    // [from, to]: the count between two instants, after every change made
    // at the first of them (a call that ends and one that starts at the
    // same instant hand a slot over; it was not idle).
    let least_busy = |s: u64, from: u64, to: u64| {
        let mine: Vec<(u64, i64)> = steps
            .iter()
            .filter(|(ss, _, _)| *ss == s)
            .map(|&(_, t, d)| (t, d))
            .collect();
        let (mut busy, mut least, mut i) = (0i64, i64::MAX, 0);
        while i < mine.len() {
            let t = mine[i].0;
            if t > to {
                break;
            }
            if t > from {
                least = least.min(busy);
            }
            while i < mine.len() && mine[i].0 == t {
                busy += mine[i].1;
                i += 1;
            }
        }
        least.min(busy)
    };
    // The slots a process lets out: `downstream.concurrency`, or under an
    // adaptive limit (which the world does not see) at least its floor.
    let slots = if sc.adaptive {
        1
    } else {
        sc.concurrency as i64
    };
    let mut v = Vec::new();
    for c in &log.calls {
        let Some(g) = c.granted_at_us else { continue };
        // A grant whose reply came back slowly was no use before it came,
        // and a pacer's units are timed from its arrival.
        let late_us = log
            .learnt_late
            .iter()
            .filter(|(r, _)| r.seller == c.seller && r.spans(g))
            .map(|&(_, late)| late)
            .max()
            .unwrap_or(0);
        let granted_ms = (g + late_us).saturating_sub(super::clock::EPOCH_US) / 1000;
        if c.at_ms <= granted_ms + SLACK_MS {
            continue;
        }
        let s = start_of(c.at_ms);
        if granted_ms < s {
            continue;
        }
        let least = least_busy(s, granted_ms + SLACK_MS, c.at_ms - SLACK_MS);
        if least < slots {
            v.push(format!(
                "4. job {} granted at {granted_ms} ms went at {} ms, with only {least} of {slots} slots busy meanwhile",
                c.job, c.at_ms
            ));
            break;
        }
    }
    v
}

/// Invariant 19 (issue 53, item 4): a write to a retry tier or the
/// dead-letter topic that fails is tried again after a wait, not at once:
/// through a produce outage of tens of seconds, a record's copy is tried
/// about once a second (`worker::engine::write`). A job fails at most 12
/// writes in any 5 s (five of one copy, and as many again of a copy
/// redelivered to another owner, with room to spare); a retry without a
/// wait fails hundreds.
pub fn no_write_loop(out: &Outcome) -> Vec<String> {
    const BOUND: usize = 12;
    let span = Duration::from_secs(5).as_millis() as u64;
    let mut by_job: BTreeMap<JobId, Vec<u64>> = BTreeMap::new();
    for &(at, job) in &out.log.write_failures {
        by_job.entry(job).or_default().push(at);
    }
    let mut v = Vec::new();
    for (job, mut at) in by_job {
        at.sort_unstable();
        if let Some(i) =
            (0..at.len()).find(|&i| at.get(i + BOUND).is_some_and(|&t| t < at[i] + span))
        {
            let n = at[i..].iter().take_while(|&&t| t < at[i] + span).count();
            v.push(format!(
                "19. job {job}: {n} failed writes to a retry tier or the dead-letter topic in 5 s from {} ms (bound {BOUND})",
                at[i]
            ));
        }
    }
    v
}

/// Invariant 5: no tight loop. Each job may fail `max_attempts` times per
/// delivery, spaced by its backoff (at least 1.5 s for five attempts with
/// the default base), so a seller with many failing jobs fails many times in
/// 5 s without looping: what is judged is what goes beyond that. A
/// seller's failed calls (429, 5xx, timeouts) in any 5 s, less up to
/// `max_attempts` of each job's, stay under ten per partition plus twenty
/// (a restarted process learns an outage anew: up to
/// `downstream.outage_after_failures` calls before it holds, and a redelivered copy
/// of a job starts its attempts over). A job called again and again
/// without a wait (a 429 that holds nothing, a retry that spends no
/// attempt) goes beyond its attempts within the window and is caught.
///
/// Seeds that broke the per-seller form, with no loop in them: world seed
/// 12937 (8 failing jobs released together by a pause's end, 39 failed
/// calls in 5 s, each job's own backoff intact) and fleet seed 9660 (one
/// failing job's copies in a kill loop).
pub fn no_tight_loop(sc: &Scenario, out: &Outcome) -> Vec<String> {
    let bound = 10 * sc.partitions as usize + 20;
    let allowed = sc.max_attempts as usize;
    let span = Duration::from_secs(5).as_millis() as u64;
    let mut failed: BTreeMap<&str, Vec<(u64, JobId)>> = BTreeMap::new();
    for c in &out.log.calls {
        if c.class != "2xx" && c.class != "4xx" {
            failed.entry(&c.seller).or_default().push((c.at_ms, c.job));
        }
    }
    let mut v = Vec::new();
    for (seller, mut at) in failed {
        at.sort_unstable();
        for i in 0..at.len() {
            let window = at[i..].iter().take_while(|&&(t, _)| t < at[i].0 + span);
            let mut per_job: BTreeMap<JobId, usize> = BTreeMap::new();
            for &(_, job) in window {
                *per_job.entry(job).or_default() += 1;
            }
            let n: usize = per_job.values().sum();
            let beyond: usize = per_job.values().map(|&k| k.saturating_sub(allowed)).sum();
            if beyond > bound {
                v.push(format!(
                    "5. {seller}: {n} failed calls in 5 s from {} ms, {beyond} of them beyond each job's {allowed} attempts (bound {bound})",
                    at[i].0
                ));
                break;
            }
        }
    }
    v
}

/// Cost units of each seller's calls that reached the downstream and
/// started within `[from_ms, to_ms)`: the throughput the shares are
/// judged on.
pub fn units_by_seller(out: &Outcome, from_ms: u64, to_ms: u64) -> BTreeMap<String, u64> {
    let mut units = BTreeMap::new();
    for c in &out.log.calls {
        if (from_ms..to_ms).contains(&c.at_ms) {
            *units.entry(c.seller.clone()).or_default() += c.cost;
        }
    }
    units
}

/// The fraction of the downstream slots busy with calls within
/// `[from_ms, to_ms)` (limiter calls hold a slot too, but are no use of
/// the downstream).
pub fn capacity_use(sc: &Scenario, out: &Outcome, from_ms: u64, to_ms: u64) -> f64 {
    let busy: u64 = out
        .log
        .calls
        .iter()
        .map(|c| c.end_ms.min(to_ms).saturating_sub(c.at_ms.max(from_ms)))
        .sum();
    busy as f64 / ((to_ms - from_ms) as f64 * sc.concurrency as f64)
}

/// When each seller's last call started: a seller has ready jobs until
/// about then.
pub fn last_call_ms(out: &Outcome) -> BTreeMap<String, u64> {
    let mut last = BTreeMap::new();
    for c in &out.log.calls {
        let at = last.entry(c.seller.clone()).or_insert(0);
        *at = c.at_ms.max(*at);
    }
    last
}

/// Invariant 13, of a world whose sellers are all backlogged and whose
/// downstream is the bottleneck (no limits, no faults): within
/// `[from_ms, to_ms)`, each of `sellers` is served cost units in
/// proportion to its weight (`limits.sellers.X.weight`), within
/// `tolerance` (0.1: 10 %) of its fair part of what they were served
/// together. Returns the measured units over weight too, for the report.
pub fn fair_shares(
    sc: &Scenario,
    out: &Outcome,
    sellers: &[usize],
    (from_ms, to_ms): (u64, u64),
    tolerance: f64,
) -> (Vec<String>, Vec<f64>) {
    let units = units_by_seller(out, from_ms, to_ms);
    let weight = |i: usize| f64::from(sc.weights.get(&i).copied().unwrap_or(1));
    let total: f64 = sellers
        .iter()
        .map(|&i| units.get(&sc.sellers[i].name).copied().unwrap_or(0) as f64)
        .sum();
    let weights: f64 = sellers.iter().map(|&i| weight(i)).sum();
    let mut broken = Vec::new();
    let mut per_weight = Vec::new();
    for &i in sellers {
        let name = &sc.sellers[i].name;
        let got = units.get(name).copied().unwrap_or(0) as f64;
        let fair = total * weight(i) / weights;
        per_weight.push(got / weight(i));
        if (got - fair).abs() > tolerance * fair {
            broken.push(format!(
                "13. {name} (weight {}) was served {got} units in [{from_ms}, {to_ms}) ms, its fair part of {total} is {fair:.1} (tolerance {:.0} %)",
                weight(i),
                tolerance * 100.0
            ));
        }
    }
    (broken, per_weight)
}
