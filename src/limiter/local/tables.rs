//! Shared helpers for the models' table-driven and property tests.

use std::time::Duration;

use super::{run, ModelStore, Op};
use crate::limiter::script::{BlockAt, BlockRead, StateKey};
use crate::limiter::{Algorithm, Mode, Reply, Rule};

/// 2023-11-15T00:00:00Z in µs: aligned to every period that divides a day,
/// so fixed windows in the tables start at row time 0.
pub(crate) const T0: u64 = 1_700_006_400_000_000;

/// The hash of the tables' seller: its block and its rule's place `r0`.
pub(crate) const HASH: &str = "model-test:{seller}";

/// Where the tables' seller's block is read.
pub(crate) fn block_at() -> BlockAt {
    BlockAt::new(HASH, BlockRead::Field)
}

/// What a table row does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Acquire(Mode),
    Peek(Mode),
    /// Refund the units of the call made at row `call`; the row's time must
    /// be that call's time (see [`Op::Refund`]).
    Refund {
        skip: u64,
        call: u32,
    },
}

pub(crate) fn all() -> Step {
    Step::Acquire(Mode::AllOrNothing)
}

pub(crate) fn upto() -> Step {
    Step::Acquire(Mode::UpTo)
}

pub(crate) fn rule(algorithm: Algorithm, limit: u64, period: Duration, burst: Option<u64>) -> Rule {
    Rule::new(algorithm, limit, period, burst).expect("test rules are valid")
}

/// row, time (µs after T0), step, cost, and the expected
/// `[status, granted, remaining, retry µs, reset µs, go_at - now]`.
pub(crate) type Row = (u32, i64, Step, u64, [i64; 6]);

fn call_id(row: u32) -> String {
    format!("call{row}")
}

pub(crate) fn call(
    store: &mut ModelStore,
    rule: &Rule,
    op: Op,
    at: u64,
    cost: u64,
    mode: Mode,
    id: &str,
) -> Reply {
    let rules = [(StateKey::new(HASH, "r0"), *rule)];
    run(store, op, T0 + at, cost, mode, id, &block_at(), &rules)
}

/// Runs the rows in order against one store and checks every field, plus
/// what holds for every row: a dry run or a refusal writes nothing, and a
/// refusal's retry-after is exact (the same request passes at
/// now + retry-after and not 1 µs earlier).
pub(crate) fn check(rule: &Rule, rows: &[Row]) {
    let mut store = ModelStore::new();
    for &(row, at, step, cost, want) in rows {
        let at = at as u64;
        let before = store.clone();
        let (op, mode, id) = match step {
            Step::Acquire(mode) => (Op::Acquire, mode, call_id(row)),
            Step::Peek(mode) => (Op::Peek, mode, call_id(row)),
            Step::Refund { skip, call } => (
                Op::Refund {
                    skip,
                    taken_at_us: T0 + at,
                },
                Mode::AllOrNothing,
                call_id(call),
            ),
        };
        let got = call(&mut store, rule, op, at, cost, mode, &id);
        let fields = [
            got.status,
            got.granted,
            got.remaining,
            got.retry_after_us,
            got.reset_after_us,
            got.go_at_us - (T0 + at) as i64,
        ];
        assert_eq!(
            fields, want,
            "{rule} row {row} (t={at}µs, {step:?}, cost {cost}): {got:?}"
        );
        let by = if matches!(step, Step::Refund { .. }) {
            0
        } else {
            1
        };
        assert_eq!(got.by, by, "{rule} row {row}: by");
        assert_eq!(got.now_us, (T0 + at) as i64, "{rule} row {row}: now");
        assert_eq!(
            got.retry_after_ms,
            (got.retry_after_us + 999) / 1000,
            "{rule} row {row}"
        );
        assert_eq!(
            got.reset_after_ms,
            (got.reset_after_us + 999) / 1000,
            "{rule} row {row}"
        );
        if matches!(step, Step::Peek(_)) || got.status != 1 {
            assert_eq!(
                store, before,
                "{rule} row {row}: a dry run or refusal wrote state"
            );
        }
        if got.status == 0 {
            assert_retry_exact(&before, rule, at, cost, mode, &got)
                .unwrap_or_else(|e| panic!("{rule} row {row}: {e}"));
        }
    }
}

/// At now + retry-after the same request passes, 1 µs earlier it does not
/// (checked with dry runs on a copy of `store`).
pub(crate) fn assert_retry_exact(
    store: &ModelStore,
    rule: &Rule,
    at: u64,
    cost: u64,
    mode: Mode,
    denied: &Reply,
) -> Result<(), String> {
    let retry = denied.retry_after_us as u64;
    let mut copy = store.clone();
    let early = call(
        &mut copy,
        rule,
        Op::Peek,
        at + retry - 1,
        cost,
        mode,
        "probe",
    );
    let on_time = call(&mut copy, rule, Op::Peek, at + retry, cost, mode, "probe");
    if early.status != 0 || on_time.status != 1 {
        return Err(format!(
            "denied at {at} with retry {retry}µs ({denied:?}); 1µs early: {early:?}; on time: {on_time:?}"
        ));
    }
    if mode == Mode::AllOrNothing && on_time.granted != cost as i64 {
        return Err(format!("on time grants {} of {cost}", on_time.granted));
    }
    Ok(())
}

/// One admission of [`drive`]: at µs after T0, `n` units.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    pub at: u64,
    pub n: u64,
    pub reply: Reply,
}

/// Drives a random arrival sequence `(gap µs, cost, up-to?)` through one
/// rule and returns the admissions. Along the way: a dry run first agrees
/// with the acquire and writes nothing, a refusal writes nothing, and every
/// refusal's retry-after is exact.
pub(crate) fn drive(rule: &Rule, calls: &[(u64, u64, bool)]) -> Vec<Admitted> {
    let mut store = ModelStore::new();
    let mut at = 0;
    let mut admitted = Vec::new();
    for (i, &(gap, cost, up_to)) in calls.iter().enumerate() {
        at += gap;
        let mode = if up_to {
            Mode::UpTo
        } else {
            Mode::AllOrNothing
        };
        let before = store.clone();
        let id = format!("call{i}");
        let peeked = call(&mut store, rule, Op::Peek, at, cost, mode, &id);
        assert_eq!(store, before, "{rule} call {i}: dry run wrote state");
        let got = call(&mut store, rule, Op::Acquire, at, cost, mode, &id);
        assert_eq!(
            peeked, got,
            "{rule} call {i} at {at}: dry run and acquire disagree"
        );
        match got.status {
            1 => {
                assert!(
                    got.granted >= 1 && got.granted as u64 <= cost,
                    "{rule} call {i}: {got:?}"
                );
                if mode == Mode::AllOrNothing {
                    assert_eq!(
                        got.granted as u64, cost,
                        "{rule} call {i}: partial all-or-nothing"
                    );
                }
                admitted.push(Admitted {
                    at,
                    n: got.granted as u64,
                    reply: got,
                });
            }
            0 => {
                assert_eq!(store, before, "{rule} call {i}: refusal wrote state");
                assert_retry_exact(&before, rule, at, cost, mode, &got)
                    .unwrap_or_else(|e| panic!("{rule} call {i}: {e}"));
            }
            _ => {
                assert!(
                    mode == Mode::AllOrNothing && cost > rule.capacity(),
                    "{rule} call {i}: {got:?}"
                );
            }
        }
    }
    admitted
}

/// In any span [a, b] of the admissions, at most
/// `burst + ceil((b - a) * limit / period)` units: the bound of a token
/// bucket or GCRA.
pub(crate) fn span_bound_violation(rule: &Rule, admitted: &[Admitted]) -> Option<String> {
    let (limit, period, burst) = (rule.limit().get(), rule.period_us(), rule.burst().get());
    for i in 0..admitted.len() {
        let mut total = 0;
        for j in i..admitted.len() {
            total += admitted[j].n;
            let d = admitted[j].at - admitted[i].at;
            let bound = burst + (d * limit).div_ceil(period);
            if total > bound {
                return Some(format!(
                    "{total} admitted in [{}, {}] (span {d}µs) > bound {bound}",
                    admitted[i].at, admitted[j].at
                ));
            }
        }
    }
    None
}
