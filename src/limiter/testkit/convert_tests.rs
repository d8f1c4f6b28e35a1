//! The tests of rule edits (`local::convert`): here, beside the test kit,
//! because they drive the model's single decision (`local::run`), which
//! itself converts through `convert`.

use std::time::Duration;

use proptest::prelude::*;

use crate::limiter::decision::Mode;
use crate::limiter::local::convert::{convert, units_in_use};
use crate::limiter::local::{cdiv, fdiv, run, Op};
use crate::limiter::local::{ModelStore, Params};
use crate::limiter::rule::{Algorithm, Rule};
use crate::limiter::script::{BlockAt, BlockRead, StateKey};

const T0: u64 = 1_700_000_000_000_000;
/// The rule's place, and its address in the model's store.
fn at() -> StateKey {
    StateKey::new("m:{s}", "r0")
}
const KEY: &str = "m:{s}#r0";

fn block() -> BlockAt {
    BlockAt::new("m:{s}", BlockRead::Field)
}

/// The conversion as a call makes it (`settle`): the new rule then
/// names the place, so the next call converts nothing more.
fn converted(store: &mut ModelStore, key: &str, old: &Rule, new: &Rule, now: u64) {
    convert(store, key, old, new, now);
    store.set_mark(key, new.fingerprint());
}

/// How the state goes from the old rule to the new one.
type Edit = fn(&mut ModelStore, &str, &Rule, &Rule, u64);

/// Today: the new rule's key is another one, so it starts fresh.
fn fresh(store: &mut ModelStore, key: &str, _: &Rule, _: &Rule, _: u64) {
    store.remove(key);
}

/// Arrivals `(gap µs, cost)` under `old`, the edit, then `after` under
/// `new`; each arrival asks up to its cost. Returns the edit's instant
/// and every grant `(at, units)`.
fn simulate(
    old: &Rule,
    new: &Rule,
    before: &[(u64, u64)],
    after: &[(u64, u64)],
    edit: Edit,
) -> (i128, Vec<(i128, i128)>) {
    let mut store = ModelStore::new();
    let mut now = T0;
    let mut grants = Vec::new();
    let mut ask = |store: &mut ModelStore, now: u64, rule: &Rule, cost: u64, i: usize| {
        let rules = [(at(), *rule)];
        let reply = run(
            store,
            Op::Acquire,
            now,
            cost,
            Mode::UpTo,
            &format!("c{i}"),
            &block(),
            &rules,
        );
        if reply.status == 1 && reply.granted > 0 {
            grants.push((i128::from(now), i128::from(reply.granted)));
        }
    };
    for (i, &(gap, cost)) in before.iter().enumerate() {
        now += gap;
        ask(&mut store, now, old, cost, i);
    }
    now += 1;
    let t_edit = now;
    edit(&mut store, KEY, old, new, t_edit);
    for (i, &(gap, cost)) in after.iter().enumerate() {
        ask(&mut store, now, new, cost, before.len() + i);
        now += gap;
    }
    (i128::from(t_edit), grants)
}

fn window_family(a: Algorithm) -> bool {
    matches!(a, Algorithm::FixedWindow | Algorithm::SlidingWindowLog)
}

fn sum_in(grants: &[(i128, i128)], lo: i128, hi: i128) -> i128 {
    grants
        .iter()
        .filter(|(t, _)| lo <= *t && *t < hi)
        .map(|(_, n)| n)
        .sum()
}

/// The oracle: admissions of every interval spanning the edit (one that
/// holds `t_edit`) against the larger of the two rules, never their sum.
///
/// - Window algorithms of one period `P` (`fixed_window`,
///   `sliding_window_log`): the aligned window of `P` that holds the
///   edit admits at most `max(limit_old, limit_new)`; between two
///   sliding logs, so does every window of `P` holding it.
/// - Buckets (`token_bucket`, `gcra`), any periods: an interval `[a, b)`
///   admits at most `max(cap_old, cap_new)` plus each rule's rate over
///   its part of the interval, `ceil((edit - a) * rate_old) +
///   ceil((b - edit) * rate_new)`: one burst, not two.
///
/// Err: the interval and what it admitted against the bound.
pub(crate) fn windows_within_the_larger_rule(
    old: &Rule,
    new: &Rule,
    t_edit: i128,
    grants: &[(i128, i128)],
) -> Result<(), String> {
    let (o, n) = (Params::from(old), Params::from(new));
    if window_family(old.algorithm()) {
        let p = o.period;
        let most = o.limit.max(n.limit);
        let start = fdiv(t_edit, p) * p;
        let got = sum_in(grants, start, start + p);
        if got > most {
            return Err(format!(
                "aligned window [{start}, +{p}) admitted {got} > {most}"
            ));
        }
        if old.algorithm() == Algorithm::SlidingWindowLog
            && new.algorithm() == Algorithm::SlidingWindowLog
        {
            let starts = grants
                .iter()
                .map(|(t, _)| *t)
                .filter(|&t| t > t_edit - p && t <= t_edit)
                .chain([t_edit - p + 1]);
            for a in starts {
                let got = sum_in(grants, a, a + p);
                if got > most {
                    return Err(format!("window [{a}, +{p}) admitted {got} > {most}"));
                }
            }
        }
        return Ok(());
    }
    let cap = i128::from(old.capacity().max(new.capacity()));
    let starts: Vec<i128> = grants
        .iter()
        .map(|(t, _)| *t)
        .filter(|&t| t <= t_edit)
        .chain([t_edit])
        .collect();
    let ends: Vec<i128> = grants
        .iter()
        .map(|(t, _)| *t + 1)
        .filter(|&t| t > t_edit)
        .collect();
    for &a in &starts {
        for &b in &ends {
            let bound = cap
                + cdiv((t_edit - a) * o.limit, o.period)
                + cdiv((b - t_edit) * n.limit, n.period);
            let got = sum_in(grants, a, b);
            if got > bound {
                return Err(format!(
                    "[{a}, {b}) around the edit at {t_edit} admitted {got} > {bound}"
                ));
            }
        }
    }
    Ok(())
}

fn rule_of(alg: Algorithm, limit: u64, period_s: u64, extra_burst: u64) -> Rule {
    let burst = alg.uses_burst().then_some(limit + extra_burst);
    Rule::new(alg, limit, Duration::from_secs(period_s), burst).expect("a valid rule")
}

/// Two rules of one family (window algorithms share a period).
pub(crate) fn rule_pair() -> impl Strategy<Value = (Rule, Rule)> {
    let windows = (
        prop::sample::select(vec![Algorithm::FixedWindow, Algorithm::SlidingWindowLog]),
        prop::sample::select(vec![Algorithm::FixedWindow, Algorithm::SlidingWindowLog]),
        1u64..40,
        1u64..40,
        prop::sample::select(vec![1u64, 2, 10]),
    )
        .prop_map(|(a, b, la, lb, p)| (rule_of(a, la, p, 0), rule_of(b, lb, p, 0)));
    let bucket = || {
        (
            prop::sample::select(vec![Algorithm::TokenBucket, Algorithm::Gcra]),
            1u64..40,
            0u64..20,
            prop::sample::select(vec![1u64, 2, 10]),
        )
            .prop_map(|(a, l, x, p)| rule_of(a, l, p, x))
    };
    prop_oneof![windows, (bucket(), bucket())]
}

/// Arrivals: gaps up to a quarter second, costs up to 12.
pub(crate) fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..250_000, 1u64..12), 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Issue 21, part 2: across an edit, every interval spanning it
    /// admits no more than the larger of the two rules.
    #[test]
    fn an_edit_never_admits_more_than_the_larger_rule(
        (old, new) in rule_pair(),
        before in arrivals(),
        after in arrivals(),
    ) {
        let (t_edit, grants) = simulate(&old, &new, &before, &after, converted);
        let verdict = windows_within_the_larger_rule(&old, &new, t_edit, &grants);
        prop_assert!(verdict.is_ok(), "{old:?} -> {new:?}: {verdict:?}\ngrants {grants:?}");
    }

    /// The oracle holds with no edit at all (each rule "edited" to
    /// itself), so a failure above is the edit's.
    #[test]
    fn the_bound_holds_without_an_edit(
        (old, _) in rule_pair(),
        before in arrivals(),
        after in arrivals(),
    ) {
        let (t_edit, grants) = simulate(&old, &old, &before, &after, converted);
        let verdict = windows_within_the_larger_rule(&old, &old, t_edit, &grants);
        prop_assert!(verdict.is_ok(), "{old:?}: {verdict:?}\ngrants {grants:?}");
    }
}

/// The oracle has teeth on random pairs too: today's behaviour (the
/// edited rule starts fresh) fails it.
#[test]
fn the_oracle_catches_a_fresh_start_on_random_pairs() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(400));
    let verdict = runner.run(
        &(rule_pair(), arrivals(), arrivals()),
        |((old, new), before, after)| {
            let (t_edit, grants) = simulate(&old, &new, &before, &after, fresh);
            windows_within_the_larger_rule(&old, &new, t_edit, &grants).map_err(TestCaseError::fail)
        },
    );
    assert!(verdict.is_err(), "a fresh start passed 400 random edits");
}

/// The example: `fixed_window` 30 per 10 s, 20 used, raised to
/// 40. Starting fresh (today) admits 60 in the window; converted, 40.
#[test]
fn a_raised_fixed_window_counts_what_it_admitted() {
    let old = rule_of(Algorithm::FixedWindow, 30, 10, 0);
    let new = rule_of(Algorithm::FixedWindow, 40, 10, 0);
    let before = [(0, 20)];
    let after = [(1, 100)];
    let (t, today) = simulate(&old, &new, &before, &after, fresh);
    assert_eq!(today.iter().map(|g| g.1).sum::<i128>(), 60);
    assert!(windows_within_the_larger_rule(&old, &new, t, &today).is_err());
    let (t, v2) = simulate(&old, &new, &before, &after, converted);
    assert_eq!(v2, vec![(v2[0].0, 20), (v2[1].0, 20)]);
    assert!(windows_within_the_larger_rule(&old, &new, t, &v2).is_ok());
}

/// A bucket emptied, then edited: starting fresh hands out a second
/// burst at once, which the oracle catches; converted, the burst used
/// still counts.
#[test]
fn an_edited_bucket_counts_its_burst_once() {
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let old = rule_of(alg, 10, 10, 10); // burst 20
        let new = rule_of(alg, 12, 10, 8); // burst 20
        let before = [(0, 20)];
        let after = [(1, 20)];
        let (t, today) = simulate(&old, &new, &before, &after, fresh);
        assert!(
            windows_within_the_larger_rule(&old, &new, t, &today).is_err(),
            "{alg:?} fresh: {today:?}"
        );
        let (t, v2) = simulate(&old, &new, &before, &after, converted);
        assert_eq!(v2.len(), 1, "{alg:?}: nothing left after the edit: {v2:?}");
        assert!(windows_within_the_larger_rule(&old, &new, t, &v2).is_ok());
    }
}

/// Lowering a limit below what is in use admits nothing until the use
/// drains; raising it admits the difference. Per algorithm pair.
#[test]
fn units_in_use_carry_over_every_algorithm_pair() {
    let all = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::BurstFill,
        Algorithm::Gcra,
    ];
    for a in all {
        for b in all {
            let old = rule_of(a, 10, 10, 0);
            for (limit, left) in [(5, 0), (10, 4), (30, 24)] {
                let new = rule_of(b, limit, 10, 0);
                let mut store = ModelStore::new();
                let rules = [(at(), old)];
                let r = run(
                    &mut store,
                    Op::Acquire,
                    T0,
                    6,
                    Mode::UpTo,
                    "c",
                    &block(),
                    &rules,
                );
                assert_eq!(r.granted, 6, "{a:?}");
                converted(&mut store, KEY, &old, &new, T0 + 1);
                let in_use = units_in_use(&store, KEY, &new, i128::from(T0 + 1));
                assert!(
                    in_use >= 6.min(i128::from(limit)),
                    "{a:?} -> {b:?} {limit}: {in_use} in use"
                );
                let rules = [(at(), new)];
                let r = run(
                    &mut store,
                    Op::Peek,
                    T0 + 1,
                    100,
                    Mode::UpTo,
                    "p",
                    &block(),
                    &rules,
                );
                assert!(
                    r.granted <= left,
                    "{a:?} -> {b:?} of {limit}: {} admissible, at most {left}",
                    r.granted
                );
            }
        }
    }
}
