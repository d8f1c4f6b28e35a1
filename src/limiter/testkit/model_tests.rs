//! Tests of the model's single decision (`local::run`), of the block
//! ([`block`]) and of [`ModelLimiter`]: here, beside the test kit they
//! use, so that the product's half of the model never imports it.

use std::time::Duration;

use proptest::prelude::*;

use crate::limiter::local::tables::{block_at, drive, rule, HASH, T0};
use crate::limiter::local::{run, ModelLimiter, ModelStore, Op, State};
use crate::limiter::script::{KeyedRule, StateKey};
use crate::limiter::testkit::{block, ManualClock};
use crate::limiter::{Algorithm, Decision, DeniedBy, Mode, Reply, Rule};

const S: u64 = 1_000_000;

fn keyed(rules: &[Rule]) -> Vec<KeyedRule> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| (StateKey::new(HASH, format!("r{i}")), *r))
        .collect()
}

fn go(
    store: &mut ModelStore,
    op: Op,
    at: u64,
    cost: u64,
    mode: Mode,
    id: &str,
    rules: &[Rule],
) -> Reply {
    run(
        store,
        op,
        T0 + at,
        cost,
        mode,
        id,
        &block_at(),
        &keyed(rules),
    )
}

/// status, granted, remaining, retry µs, reset µs, by.
fn brief(r: &Reply) -> [i64; 6] {
    [
        r.status,
        r.granted,
        r.remaining,
        r.retry_after_us,
        r.reset_after_us,
        r.by,
    ]
}

#[test]
fn all_or_nothing_across_rules() {
    let rules = [
        rule(Algorithm::FixedWindow, 5, Duration::from_secs(1), None),
        rule(Algorithm::Gcra, 2, Duration::from_secs(1), None),
    ];
    let mut store = ModelStore::new();
    let all = Mode::AllOrNothing;
    // row: at, cost, mode, [status, granted, remaining, retry, reset, by]
    #[rustfmt::skip]
    let rows = [
        // 1: both grant; gcra is the tighter rule.
        (1, 0, 2, all, [1, 2, 0, 0, S as i64, 2]),
        // 2: gcra refuses; the fixed window is not charged.
        (2, 1, 1, all, [0, 0, 0, 499_999, 999_999, 2]),
        // 3: up to: gcra has room for 1 at 0.5 s, the window for 3.
        (3, 500_000, 5, Mode::UpTo, [1, 1, 0, 0, 1_000_000, 2]),
        // 4: cost 3 is above gcra's burst: never, named by rule 2.
        (4, 500_000, 3, all, [-1, 0, 0, 0, 0, 2]),
        // 5: cost 6 is above both: the first rule is named.
        (5, 500_000, 6, all, [-1, 0, 0, 0, 0, 1]),
    ];
    for (row, at, cost, mode, want) in rows {
        let got = go(
            &mut store,
            Op::Acquire,
            at,
            cost,
            mode,
            &format!("c{row}"),
            &rules,
        );
        assert_eq!(brief(&got), want, "row {row}: {got:?}");
    }
    assert_eq!(
        store.get("model-test:{seller}#r0"),
        Some(&State::FixedWindow(
            crate::limiter::local::fixed_window::Stored {
                w: (T0 / S) as i128 * S as i128,
                n: 3
            }
        )),
        "the window counts rows 1 and 3 only"
    );
}

#[test]
fn the_longest_wait_wins_and_names_the_first_rule_with_it() {
    let rules = [
        rule(Algorithm::FixedWindow, 1, Duration::from_secs(1), None),
        rule(Algorithm::SlidingWindowLog, 1, Duration::from_secs(2), None),
        rule(Algorithm::BurstFill, 1, Duration::from_secs(2), None),
    ];
    let mut store = ModelStore::new();
    let got = go(
        &mut store,
        Op::Acquire,
        0,
        1,
        Mode::AllOrNothing,
        "c1",
        &rules,
    );
    assert_eq!(brief(&got), [1, 1, 0, 0, 2 * S as i64, 1]);
    let got = go(
        &mut store,
        Op::Acquire,
        10,
        1,
        Mode::AllOrNothing,
        "c2",
        &rules,
    );
    assert_eq!(
        brief(&got),
        [0, 0, 0, 2 * S as i64 - 10, 2 * S as i64 - 10, 2]
    );
}

#[test]
fn pacer_sets_go_at_for_the_whole_call() {
    let rules = [
        rule(Algorithm::Gcra, 10, Duration::from_secs(1), None),
        rule(Algorithm::LeakyBucket, 2, Duration::from_secs(1), Some(4)),
    ];
    let mut store = ModelStore::new();
    let first = go(
        &mut store,
        Op::Acquire,
        0,
        2,
        Mode::AllOrNothing,
        "c1",
        &rules,
    );
    assert_eq!(first.go_at_us, T0 as i64);
    let second = go(
        &mut store,
        Op::Acquire,
        0,
        1,
        Mode::AllOrNothing,
        "c2",
        &rules,
    );
    assert_eq!(
        second.go_at_us,
        (T0 + S) as i64,
        "behind two units at 0.5 s each"
    );
    let pace = second.grant(&rules).pace.expect("a pacer took part");
    assert_eq!((pace.first_at_us, pace.interval_us), (T0 + S, 500_000));
}

#[test]
fn refund_returns_what_the_call_took_under_every_rule() {
    let rules: Vec<Rule> = Algorithm::ALL
        .iter()
        .map(|&a| rule(a, 4, Duration::from_secs(1), None))
        .collect();
    let mut store = ModelStore::new();
    let at = 250_000;
    let took = go(
        &mut store,
        Op::Acquire,
        at,
        3,
        Mode::AllOrNothing,
        "c1",
        &rules,
    );
    assert_eq!(took.granted, 3, "{took:?}");
    let before_second = store.clone();
    let second = go(
        &mut store,
        Op::Acquire,
        at,
        1,
        Mode::AllOrNothing,
        "c2",
        &rules,
    );
    assert_eq!(second.status, 1);
    // The cluster flow: the global rule refused call c2, give its unit back.
    let refund = go(
        &mut store,
        Op::Refund {
            skip: 0,
            taken_at_us: T0 + at,
        },
        at,
        1,
        Mode::AllOrNothing,
        "c2",
        &rules,
    );
    assert_eq!(brief(&refund), [1, 1, 0, 0, 0, 0]);
    assert_eq!(refund.now_us, (T0 + at) as i64);
    assert_eq!(refund.go_at_us, (T0 + at) as i64);
    // The leaky bucket also names the call that queued last; its queue is
    // back where it was. The sliding log names no calls: its entries'
    // times are back where they were.
    let queue = |s: Option<&State>| match s {
        Some(State::Queue(t, _)) => format!("{:?}", State::Tat(*t)),
        Some(State::SlidingWindowLog(log)) => {
            format!("{:?}", log.scores_above(i128::MIN).collect::<Vec<_>>())
        }
        other => format!("{other:?}"),
    };
    for (key, _) in keyed(&rules) {
        let key = key.address();
        assert_eq!(
            queue(store.get(&key)),
            queue(before_second.get(&key)),
            "{key}"
        );
    }
}

#[test]
fn a_shorter_block_never_shortens_a_longer_one() {
    let mut store = ModelStore::new();
    assert_eq!(block(&mut store, &block_at(), T0, 300_000), T0 + 300_000);
    assert_eq!(block(&mut store, &block_at(), T0 + 1, 1_000), T0 + 300_000);
    assert_eq!(
        block(&mut store, &block_at(), T0 + 2, 400_000),
        T0 + 400_002
    );
    assert_eq!(store.keys(), vec![format!("{HASH}#block")]);
}

#[test]
fn a_block_refuses_with_its_own_time() {
    let rules = [rule(Algorithm::Gcra, 2, Duration::from_secs(1), None)];
    let mut store = ModelStore::new();
    block(&mut store, &block_at(), T0, 300_000);
    let got = go(
        &mut store,
        Op::Acquire,
        100_000,
        1,
        Mode::AllOrNothing,
        "c1",
        &rules,
    );
    assert_eq!(brief(&got), [0, 0, 0, 200_000, 200_000, 0]);
    assert_eq!(got.retry_after_ms, 200);
    // Cost above capacity is "never" even while blocked.
    let got = go(
        &mut store,
        Op::Acquire,
        100_000,
        3,
        Mode::AllOrNothing,
        "c2",
        &rules,
    );
    assert_eq!(got.status, -1);
    let got = go(
        &mut store,
        Op::Acquire,
        300_000,
        2,
        Mode::AllOrNothing,
        "c3",
        &rules,
    );
    assert_eq!(brief(&got), [1, 2, 0, 0, S as i64, 1]);
}

/// Regression: answering a blocked seller with the block's time alone (as
/// limiter.lua once did) makes a caller that retries when the block ends be
/// refused again by an exhausted rule. Both wait for the longer of the two.
#[test]
fn a_block_does_not_hide_a_longer_wait() {
    let rules = [rule(Algorithm::Gcra, 1, Duration::from_secs(1), None)];
    let mut store = ModelStore::new();
    assert_eq!(
        go(
            &mut store,
            Op::Acquire,
            0,
            1,
            Mode::AllOrNothing,
            "c1",
            &rules
        )
        .status,
        1
    );
    block(&mut store, &block_at(), T0, 300_000);
    let got = go(
        &mut store,
        Op::Acquire,
        100_000,
        1,
        Mode::AllOrNothing,
        "c2",
        &rules,
    );
    // The block alone would answer [0, 0, 0, 200_000, 200_000, 0].
    assert_eq!(brief(&got), [0, 0, 0, 900_000, 900_000, 1]);
    let retry = go(
        &mut store,
        Op::Peek,
        1_000_000,
        1,
        Mode::AllOrNothing,
        "c3",
        &rules,
    );
    assert_eq!(
        retry.status, 1,
        "retry at now + retry_after passes: {retry:?}"
    );
}

#[test]
fn model_limiter_gives_three_kinds_of_answer() {
    let rules = [rule(
        Algorithm::TokenBucket,
        2,
        Duration::from_secs(1),
        Some(2),
    )];
    let clock = ManualClock::new(T0);
    let mut limiter = ModelLimiter::new(clock.clone());
    assert_eq!(limiter.acquire(&rules, 2, Mode::AllOrNothing).granted(), 2);
    let Decision::Denied(denied) = limiter.acquire(&rules, 1, Mode::AllOrNothing) else {
        panic!("the bucket is empty");
    };
    assert_eq!(denied.retry_after, Duration::from_millis(500));
    assert_eq!(denied.by, DeniedBy::Rule(0));
    clock.advance(denied.retry_after - Duration::from_micros(1));
    assert!(matches!(
        limiter.peek(&rules, 1, Mode::AllOrNothing),
        Decision::Denied(_)
    ));
    clock.advance(Duration::from_micros(1));
    assert_eq!(limiter.peek(&rules, 1, Mode::AllOrNothing).granted(), 1);
    let Decision::Never(never) = limiter.acquire(&rules, 3, Mode::AllOrNothing) else {
        panic!("cost 3 is above the bucket");
    };
    assert_eq!((never.cost, never.capacity, never.rule), (3, 2, 0));
    limiter.block(Duration::from_secs(2));
    let Decision::Denied(denied) = limiter.acquire(&rules, 1, Mode::UpTo) else {
        panic!("blocked");
    };
    assert_eq!(
        (denied.by, denied.retry_after),
        (DeniedBy::DownstreamBlock, Duration::from_secs(2))
    );
    clock.set(T0 + 10 * S);
    assert_eq!(limiter.acquire(&rules, 5, Mode::UpTo).granted(), 2);
    assert_eq!(
        limiter.store().keys(),
        vec![
            format!("{}#block", ModelLimiter::<ManualClock>::BLOCK_KEY),
            format!("{}#r0", ModelLimiter::<ManualClock>::rule_key(&rules[0]))
        ]
    );
}

/// A cost of 0 is refused for every op, as limiter.lua refuses it with an
/// error reply: the model panics (see [`run`]) and writes nothing. The
/// model used to answer 0 with a "grant" of 0 units that started a
/// burst_fill period.
#[test]
fn cost_zero_is_refused_for_every_op() {
    let rules = [rule(Algorithm::BurstFill, 3, Duration::from_secs(1), None)];
    let mut store = ModelStore::new();
    assert_eq!(
        go(
            &mut store,
            Op::Acquire,
            0,
            1,
            Mode::AllOrNothing,
            "c1",
            &rules
        )
        .status,
        1
    );
    let before = store.clone();
    for op in [
        Op::Acquire,
        Op::Peek,
        Op::Refund {
            skip: 0,
            taken_at_us: T0,
        },
    ] {
        for mode in [Mode::AllOrNothing, Mode::UpTo] {
            let mut probe = store.clone();
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                go(&mut probe, op, 10, 0, mode, "c1", &rules)
            }));
            let msg = got
                .expect_err(&format!("{op:?} {mode:?} with cost 0 must panic"))
                .downcast::<&str>()
                .map(|m| m.to_string())
                .unwrap_or_default();
            assert!(
                msg.starts_with("cost must be at least 1"),
                "{op:?} {mode:?}: panicked with {msg:?}"
            );
            assert_eq!(probe, before, "{op:?} {mode:?} with cost 0 wrote state");
        }
    }
}

fn any_rule() -> impl Strategy<Value = Rule> {
    (0..Algorithm::ALL.len(), 1u64..6, 50u64..2_000, 1u64..6).prop_map(
        |(a, limit, period, burst)| {
            let algorithm = Algorithm::ALL[a];
            let burst = algorithm.uses_burst().then_some(burst);
            rule(algorithm, limit, Duration::from_micros(period), burst)
        },
    )
}

proptest! {
    /// For every algorithm: a dry run agrees with the acquire and writes
    /// nothing, a refusal writes nothing, and a caller that retries exactly
    /// at retry-after passes (not 1 µs earlier).
    #[test]
    fn every_algorithm_retries_exactly(
        r in any_rule(),
        calls in prop::collection::vec((0u64..400, 1u64..7, any::<bool>()), 1..80),
    ) {
        drive(&r, &calls);
    }

    /// Over several rules at once: a refusal charges no rule, and the
    /// same request passes at now + retry-after and not 1 µs earlier.
    #[test]
    fn several_rules_retry_exactly_and_refusals_charge_nothing(
        rules in prop::collection::vec(any_rule(), 1..4),
        calls in prop::collection::vec((0u64..400, 1u64..7, any::<bool>()), 1..60),
    ) {
        let mut store = ModelStore::new();
        let mut at = 0;
        for (i, (gap, cost, up_to)) in calls.into_iter().enumerate() {
            at += gap;
            let mode = if up_to { Mode::UpTo } else { Mode::AllOrNothing };
            let before = store.clone();
            let got = go(&mut store, Op::Acquire, at, cost, mode, &format!("c{i}"), &rules);
            if got.status != 1 {
                prop_assert_eq!(&store, &before, "call {}: {:?}", i, got);
            }
            if got.status == 0 {
                let retry = got.retry_after_us as u64;
                let mut probe = before.clone();
                let early = go(&mut probe, Op::Peek, at + retry - 1, cost, mode, "p", &rules);
                let on_time = go(&mut probe, Op::Peek, at + retry, cost, mode, "p", &rules);
                prop_assert_eq!(early.status, 0, "call {} at {}: {:?}, early {:?}", i, at, got, early);
                prop_assert_eq!(on_time.status, 1, "call {} at {}: {:?}, on time {:?}", i, at, got, on_time);
            }
        }
    }
}
