//! `lua/jobs.lua` and the cancel of `lua/calls.lua` in Rust: the driver the
//! tests hold the worker's job-list calls to ([`run_jobs`], [`cancel`]),
//! and the in-memory Redis of the simulation. Not compiled into the
//! product: the local fallback decides job by job with
//! [`ModelLimiter`](crate::limiter::local::ModelLimiter).

use super::calls;
use crate::config::OnStateLoss;
use crate::limiter::local::decide::{
    cap_of, field, lost_fill, refund_request, scratch_for, settle, stamp, Out, Placed,
};
use crate::limiter::local::{cdiv, ModelStore, Params};
use crate::limiter::reply::{EpochFound, JobsReply};
use crate::limiter::rule::Algorithm;
use crate::limiter::script::{JobsRequest, KeyedRule, LossGuard, SlotTerms};

/// `lua/jobs.lua`: per request, the longest prefix of its jobs that fits,
/// each job all or nothing across the request's rules; requests in order,
/// each seeing what the ones before it wrote. One [`JobsReply`] per request.
///
/// # Panics
///
/// If a request has no jobs or a job costs 0 (the script answers with an
/// error reply; [`Limiter`](crate::limiter::Limiter) never sends either).
pub fn run_jobs(
    store: &mut ModelStore,
    now_us: u64,
    dry_run: bool,
    requests: &[JobsRequest],
) -> Vec<JobsReply> {
    run_guarded(store, now_us, dry_run, requests, None).0
}

/// [`run_jobs`] with the loss guard of `lua/jobs.lua`: also whether this
/// call found the epoch gone (and, charging, wrote it).
pub fn run_guarded(
    store: &mut ModelStore,
    now_us: u64,
    dry_run: bool,
    requests: &[JobsRequest],
    guard: Option<&LossGuard>,
) -> (Vec<JobsReply>, EpochFound) {
    assert!(
        requests
            .iter()
            .all(|q| !q.costs.is_empty() && q.costs.iter().all(|&c| c >= 1)),
        "every request needs at least one job, each of cost >= 1"
    );
    let now = i128::from(now_us);
    let all: Vec<KeyedRule> = requests.iter().flat_map(|q| q.rules.clone()).collect();
    let mut scratch = scratch_for(store, dry_run, &all);
    let store = scratch.as_mut().unwrap_or(store);
    let charge = !dry_run;
    let mut guard = guard.map(|g| Guard::new(g, charge));
    let replies = requests
        .iter()
        .map(|q| {
            // calls.lua: a request cancelled before it ran charges nothing;
            // a charged one is recorded for a later cancel.
            if charge && calls::cancelled_before(store, q, now) {
                return JobsReply {
                    head: Out {
                        status: 0,
                        granted: 0,
                        remaining: 0,
                        retry_us: 0,
                        reset_us: 0,
                        go_at: now,
                        by: 0,
                    }
                    .reply(now),
                    jobs: 0,
                    next: 1,
                    tight: 0,
                };
            }
            let reply = jobs_request(store, now, charge, q, guard.as_mut());
            if charge && reply.head.status == 1 && reply.head.granted > 0 && !q.rules.is_empty() {
                calls::record(store, q, now, i128::from(reply.head.granted));
            }
            reply
        })
        .collect();
    (replies, guard.map_or(EpochFound::Kept, |g| g.found))
}

/// `cancel` of `lua/calls.lua`: per request, the units of its recorded
/// jobs call given back (each rule's refund, taken at the recorded time),
/// -1 when a tombstone was left (no record), 0 when nothing was done
/// (cancelled already, or not recorded).
pub fn cancel(store: &mut ModelStore, now_us: u64, requests: &[JobsRequest]) -> Vec<i64> {
    let now = i128::from(now_us);
    for q in requests {
        // Its slots of max_in_flight too: the worker never held them.
        if let Some(s) = &q.slots {
            let leases: Vec<String> = (0..q.costs.len())
                .map(|j| SlotTerms::lease(&q.call_id, j))
                .collect();
            store.release(&s.key, &leases);
        }
    }
    requests
        .iter()
        .map(|q| match calls::cancel(store, q, now) {
            calls::Cancelled::Refund { at, units } => {
                refund_request(store, &q.rules, now.max(at), units, &q.call_id, 0, at);
                field(units)
            }
            calls::Cancelled::Tombstone => -1,
            calls::Cancelled::Nothing => 0,
        })
        .collect()
}

/// The loss guard of one call (`new_guard`/`guard_lost` of common.lua):
/// the epoch read at the first need only, an unwritten v2 place or an
/// empty slot set, and whether this call found it gone (and, charging,
/// wrote it).
struct Guard<'a> {
    guard: &'a LossGuard,
    charge: bool,
    read: Option<i128>,
    found: EpochFound,
}

impl<'a> Guard<'a> {
    fn new(guard: &'a LossGuard, charge: bool) -> Guard<'a> {
        Guard {
            guard,
            charge,
            read: None,
            found: EpochFound::Kept,
        }
    }

    /// The instant the state was lost, with 'wait'; `None` with 'admit'.
    /// A new install writes a missing epoch as 0: never lost.
    fn lost(&mut self, store: &mut ModelStore, now: i128) -> Option<i128> {
        let at = match self.read {
            Some(at) => at,
            None => {
                let at = match store.epochs.get(&self.guard.epoch) {
                    Some(&at) => at,
                    None => {
                        let at = if self.guard.new_install { 0 } else { now };
                        if self.charge {
                            self.found = if self.guard.new_install {
                                EpochFound::NewInstall
                            } else {
                                EpochFound::Lost
                            };
                            store.epochs.insert(self.guard.epoch.clone(), at);
                        }
                        at
                    }
                };
                self.read = Some(at);
                at
            }
        };
        (self.guard.on_loss == OnStateLoss::Wait).then_some(at)
    }
}

fn jobs_request(
    store: &mut ModelStore,
    now: i128,
    charge: bool,
    q: &JobsRequest,
    mut guard: Option<&mut Guard<'_>>,
) -> JobsReply {
    let costs: Vec<i128> = q.costs.iter().map(|&c| i128::from(c)).collect();
    let reply = |out: Out, jobs: i64, next: i64| JobsReply {
        head: out.reply(now),
        jobs,
        next,
        tight: 0,
    };
    let out = |status, granted, remaining, retry_us, reset_us, go_at, by| Out {
        status,
        granted,
        remaining,
        retry_us,
        reset_us,
        go_at,
        by,
    };
    // 1-based index of the first rule whose capacity `cost` exceeds, else 0.
    let never = |cost: i128| {
        q.rules
            .iter()
            .position(|(_, rule)| cost > cap_of(rule))
            .map_or(0, |i| i as i128 + 1)
    };
    let first_never = never(costs[0]);
    if first_never > 0 {
        return reply(out(-1, 0, 0, 0, 0, now, first_never), 0, 2);
    }

    // A bounded loss holds the list until `hold`, by rule `hby` (1-based).
    let (mut hold, mut hby) = (0, 0);
    for (i, (key, rule)) in q.rules.iter().enumerate() {
        settle(store, key, rule, now);
        // A place no rule has written: the guard reads the epoch.
        let unwritten = store.mark(&key.address()).is_none();
        if let Some(g) = guard.as_deref_mut().filter(|_| unwritten) {
            let max = g.guard.max_wait_us.map(i128::from);
            let held = g
                .lost(store, now)
                .and_then(|lost| lost_fill(store, key, rule, lost, max, now));
            if let Some(held) = held.filter(|&h| h > hold) {
                (hold, hby) = (held, i as i128 + 1);
            }
        }
    }
    let states: Vec<Placed> = q
        .rules
        .iter()
        .map(|(key, rule)| Placed::load(store, key, rule, now))
        .collect();
    let avail: Vec<i128> = states.iter().map(|st| st.avail(now)).collect();
    let n = avail.iter().copied().min();
    let wait_for = |cost: i128, taken: i128| {
        let (mut wait, mut by) = (0, 0);
        for (i, st) in states.iter().enumerate() {
            if avail[i] - taken < cost {
                let w = st.wait(now, cost, taken);
                if w > wait {
                    (wait, by) = (w, i as i128 + 1);
                }
            }
        }
        (wait, by)
    };
    let summary = |taken: i128| {
        let (mut remaining, mut reset, mut tight) = (None, 0, 0);
        for (i, st) in states.iter().enumerate() {
            let left = st.left(now, taken);
            if remaining.is_none_or(|r| left < r) {
                (remaining, tight) = (Some(left), i as i64 + 1);
            }
            reset = reset.max(st.reset(now, taken));
        }
        (remaining.unwrap_or(0), reset, tight)
    };

    let blocked_until = store.block_until(&q.block).unwrap_or(0);
    if blocked_until > now || hold > now {
        let block = (blocked_until - now).max(0);
        let (mut wait, mut by) = wait_for(costs[0], 0);
        let (_, reset, _) = summary(0);
        if hold - now > wait {
            (wait, by) = (hold - now, hby);
        }
        if block > 0 && block >= wait {
            (wait, by) = (block, 0);
        }
        return reply(
            out(0, 0, 0, wait, block.max(hold - now).max(reset), now, by),
            0,
            1,
        );
    }

    let free = q.slots.as_ref().map(|s| {
        let live = store.slots_live(&s.key, now) as i128;
        let lost = match guard.filter(|_| live == 0) {
            Some(g) => g.lost(store, now),
            None => None,
        };
        let lost = lost.is_some_and(|lost| store.slots_lost(s, lost, now, charge));
        if lost {
            0
        } else {
            i128::from(s.max) - live
        }
    });
    let (mut jobs, mut units, mut stop, mut capped) = (0usize, 0i128, 0i128, false);
    for (j, &c) in costs.iter().enumerate() {
        stop = never(c);
        if stop > 0 || n.is_some_and(|n| units + c > n) {
            break;
        }
        if free.is_some_and(|free| j as i128 + 1 > free) {
            capped = true;
            break;
        }
        (jobs, units) = (jobs + 1, units + c);
    }
    let poll = q.slots.as_ref().map_or(0, |s| i128::from(s.poll_us));
    if jobs == 0 {
        let (remaining, reset, _) = summary(0);
        if capped {
            return reply(out(0, 0, remaining, poll, reset, now, 0), 0, 3);
        }
        let (wait, by) = wait_for(costs[0], 0);
        return reply(out(0, 0, remaining, wait, reset, now, by), 0, 1);
    }

    let go_at = states
        .iter()
        .filter_map(|st| st.go(now))
        .fold(now, i128::max);
    let (remaining, reset, tight) = summary(units);
    let (retry, by, next) = if jobs == costs.len() {
        (0, 0, 0)
    } else if stop > 0 {
        (0, stop, 2)
    } else if capped {
        (poll, 0, 3)
    } else {
        let (wait, by) = wait_for(costs[jobs], units);
        (wait, by, 1)
    };
    if charge {
        for ((key, rule), st) in q.rules.iter().zip(&states) {
            st.take(store, now, units, &q.call_id);
            stamp(store, key, rule);
        }
        if let Some(s) = &q.slots {
            // A pacer's later units go later: leases run from the grant's
            // last unit's go-at.
            let span = q
                .rules
                .iter()
                .filter(|(_, r)| r.algorithm() == Algorithm::LeakyBucket)
                .map(|(_, r)| {
                    let p = Params::from(r);
                    cdiv(p.period, p.limit) * units
                })
                .max()
                .unwrap_or(0);
            let until = go_at + span + i128::from(s.lease_us);
            store.slots_take(&s.key, now, &q.call_id, jobs, until);
        }
    }
    JobsReply {
        tight,
        ..reply(
            out(1, units, remaining, retry, reset, go_at, by),
            jobs as i64,
            next,
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::limiter::rule::Rule;
    use crate::limiter::script::{BlockAt, BlockRead, StateKey};
    use crate::limiter::testkit::convert_tests::{
        arrivals, rule_pair, windows_within_the_larger_rule,
    };

    const T0: i128 = 1_700_000_000_000_000;
    const EPOCH: &str = "m:{epoch}";

    fn request(rule: &Rule, id: &str, cost: u64) -> JobsRequest {
        JobsRequest {
            call_id: id.to_owned(),
            block: BlockAt {
                key: "m:{s}:v2".to_owned(),
                read: BlockRead::Field,
            },
            rules: vec![(StateKey::new("m:{s}:v2", "r0"), *rule)],
            costs: vec![cost],
            slots: None,
        }
    }

    /// Arrivals `(gap µs, cost)` of one seller under `rule`, each a jobs
    /// call of one job with the loss guard; Redis loses everything (the
    /// epoch too) before arrival `lose_at`. The install ran before: its
    /// epoch is an hour old. Returns the loss's instant and every grant.
    fn lose_midway(
        rule: &Rule,
        on_loss: OnStateLoss,
        arrivals: &[(u64, u64)],
        lose_at: usize,
    ) -> (i128, Vec<(i128, i128)>) {
        let guard = LossGuard {
            epoch: EPOCH.to_owned(),
            on_loss,
            new_install: false,
            max_wait_us: None,
            seen: None,
        };
        let mut store = ModelStore::new();
        store.set_epoch(EPOCH, T0 - 3_600_000_000);
        let (mut now, mut lost, mut grants) = (T0, T0, Vec::new());
        for (i, &(gap, cost)) in arrivals.iter().enumerate() {
            now += i128::from(gap);
            if i == lose_at {
                store = ModelStore::new();
                lost = now;
            }
            let q = request(rule, &format!("c{i}"), cost);
            let (replies, _) = run_guarded(&mut store, now as u64, false, &[q], Some(&guard));
            if replies[0].head.status == 1 {
                grants.push((now, i128::from(replies[0].head.granted)));
            }
        }
        if lose_at >= arrivals.len() {
            lost = now + 1;
        }
        (lost, grants)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Issue 33, item 2: with `on_state_loss = "wait"` a loss of Redis'
        /// data admits no more across it than the rule does: every
        /// interval spanning the loss within the rule's bound (the oracle
        /// of rule edits, with the rule "edited" to itself at the loss).
        #[test]
        fn a_loss_never_admits_more_than_the_rule(
            (rule, _) in rule_pair(),
            before in arrivals(),
            after in arrivals(),
        ) {
            let lose_at = before.len();
            let all: Vec<(u64, u64)> = before.into_iter().chain(after).collect();
            let (lost, grants) = lose_midway(&rule, OnStateLoss::Wait, &all, lose_at);
            let verdict = windows_within_the_larger_rule(&rule, &rule, lost, &grants);
            prop_assert!(verdict.is_ok(), "{rule:?}: {verdict:?}\ngrants {grants:?}");
        }
    }

    /// The same oracle catches what `admit` allows (and what every
    /// release before the guard did): the lost state read as fresh
    /// admits a second window's worth.
    #[test]
    fn admit_gives_a_second_window_and_wait_does_not() {
        let rule = Rule::new(
            crate::limiter::Algorithm::FixedWindow,
            5,
            std::time::Duration::from_secs(10),
            None,
        )
        .expect("a valid rule");
        // Five jobs at T0, Redis loses its data 2 s later, five more.
        let arrivals: Vec<(u64, u64)> = [(0, 1); 5]
            .into_iter()
            .chain([(2_000_000, 1)])
            .chain([(0, 1); 4])
            .collect();
        let (lost, grants) = lose_midway(&rule, OnStateLoss::Admit, &arrivals, 5);
        let admitted: i128 = grants.iter().map(|(_, n)| n).sum();
        assert_eq!(admitted, 10, "admit: the window counts anew after the loss");
        assert!(windows_within_the_larger_rule(&rule, &rule, lost, &grants).is_err());

        let (lost, grants) = lose_midway(&rule, OnStateLoss::Wait, &arrivals, 5);
        let admitted: i128 = grants.iter().map(|(_, n)| n).sum();
        assert_eq!(admitted, 5, "wait: nothing more until the window ends");
        windows_within_the_larger_rule(&rule, &rule, lost, &grants).expect("within the rule");
    }

    fn guard(new_install: bool, max_wait_us: Option<u64>) -> LossGuard {
        LossGuard {
            epoch: EPOCH.to_owned(),
            on_loss: OnStateLoss::Wait,
            new_install,
            max_wait_us,
            seen: None,
        }
    }

    fn rule(algorithm: crate::limiter::Algorithm, limit: u64, secs: u64) -> Rule {
        Rule::new(algorithm, limit, std::time::Duration::from_secs(secs), None)
            .expect("a valid rule")
    }

    /// Issue 52, item 1: on an empty Redis, a call that says the install
    /// is new (its group never committed) is granted at once and writes
    /// the epoch as "never lost"; the same call without the flag reads
    /// the empty Redis as a loss and holds the seller for its window.
    #[test]
    fn a_new_install_is_not_a_loss() {
        let hourly = rule(crate::limiter::Algorithm::FixedWindow, 100, 3_600);
        let call = |store: &mut ModelStore, now: i128, g: &LossGuard| {
            let q = request(&hourly, &format!("c{now}"), 1);
            let (replies, found) = run_guarded(store, now as u64, false, &[q], Some(g));
            (replies[0].head.status, found)
        };
        let mut store = ModelStore::new();
        assert_eq!(
            call(&mut store, T0, &guard(true, None)),
            (1, EpochFound::NewInstall)
        );
        assert_eq!(store.epochs.get(EPOCH), Some(&0), "written as never lost");
        // Written once: later calls, new or not, find it kept.
        assert_eq!(
            call(&mut store, T0 + 1, &guard(false, None)),
            (1, EpochFound::Kept)
        );

        let mut store = ModelStore::new();
        assert_eq!(
            call(&mut store, T0, &guard(false, None)),
            (0, EpochFound::Lost)
        );
        // A new install's flag cannot undo a loss already written.
        assert_eq!(
            call(&mut store, T0 + 1, &guard(true, None)),
            (0, EpochFound::Kept)
        );
    }

    /// Issue 52, item 4: with `redis.state_loss_wait`, a rule whose whole
    /// use would count longer than the bound (an hourly window) is held,
    /// unwritten, until the loss plus the bound, by that rule, and then
    /// starts fresh; a rule that drains within the bound (gcra 10/s) is
    /// charged its whole use at the loss as before.
    #[test]
    fn a_bounded_wait_holds_a_seller_at_most_the_bound() {
        let hourly = rule(crate::limiter::Algorithm::FixedWindow, 100, 3_600);
        let bound = guard(false, Some(5_000_000));
        let call = |store: &mut ModelStore, now: i128, r: &Rule| {
            let q = request(r, &format!("c{now}"), 1);
            run_guarded(store, now as u64, false, &[q], Some(&bound)).0[0]
        };
        // Redis lost everything (the epoch too); the first call finds it at T0.
        let mut store = ModelStore::new();
        let first = call(&mut store, T0, &hourly);
        assert_eq!(
            (first.head.status, first.head.by),
            (0, 1),
            "held by the rule"
        );
        assert_eq!(first.head.retry_after_us, 5_000_000, "until the bound");
        let later = call(&mut store, T0 + 4_000_000, &hourly);
        assert_eq!(later.head.retry_after_us, 1_000_000, "the same end");
        assert_eq!(
            call(&mut store, T0 + 5_000_000, &hourly).head.status,
            1,
            "fresh after"
        );

        let gcra = Rule::new(
            crate::limiter::Algorithm::Gcra,
            10,
            std::time::Duration::from_secs(1),
            None,
        )
        .expect("a valid rule");
        let mut store = ModelStore::new();
        let first = call(&mut store, T0, &gcra);
        assert_eq!(first.head.status, 0, "a whole use at the loss");
        assert!(
            first.head.retry_after_us <= 100_000,
            "drains as before: {first:?}"
        );
    }
}
