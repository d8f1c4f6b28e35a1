//! Table-driven cases per algorithm against a real Redis, with explicit
//! times (µs after an aligned base T0). Every refusal is also checked to be
//! exact: a dry run at `retry_after - 1 µs` is still refused and one at
//! `retry_after` passes.

use crate::common::{limiter, policy, rule, unique_prefix, T0};
use throttle_worker::config::RuleConfig;
use throttle_worker::limiter::{Decision, Mode, Request};

use Mode::{AllOrNothing as All, UpTo};

#[derive(Debug, Clone, Copy)]
enum Want {
    /// granted, remaining
    Grant(u64, u64),
    /// granted, remaining, go-at offset from T0 (pacer)
    GrantAt(u64, u64, u64),
    /// retry-after in µs
    Deny(u64),
    Never,
}

type Row = (u32, u64, u64, Mode, Want);

async fn run_table(name: &str, rule: RuleConfig, rows: &[Row]) {
    let prefix = unique_prefix(name);
    let lim = limiter(&prefix, policy(vec![rule], vec![])).await;
    for &(row, t, cost, mode, want) in rows {
        let req = Request {
            seller: "seller-a",
            cost,
            mode,
            dry_run: false,
            at_us: Some(T0 + t),
        };
        let got = lim.check(req).await.expect("limiter call");
        let ctx = format!("{name} row {row} (t=+{t}µs cost={cost} {mode:?}): got {got:?}");
        match (want, &got) {
            (Want::Grant(n, rem), Decision::Granted(g)) => {
                assert_eq!((g.granted, g.remaining), (n, rem), "{ctx}");
            }
            (Want::GrantAt(n, rem, go), Decision::Granted(g)) => {
                assert_eq!((g.granted, g.remaining), (n, rem), "{ctx}");
                let pace = g.pace.expect("a pacer grant carries its go-at");
                assert_eq!(pace.first_at_us, T0 + go, "{ctx}");
            }
            (Want::Deny(retry), Decision::Denied(d)) => {
                assert_eq!(d.retry_after.as_micros() as u64, retry, "{ctx}");
                assert_eq!(d.retry_after_ms(), retry.div_ceil(1000), "{ctx}");
                let probe = |dt: u64| Request {
                    dry_run: true,
                    at_us: Some(T0 + t + dt),
                    ..req
                };
                let early = lim.check(probe(retry - 1)).await.unwrap();
                assert!(
                    matches!(early, Decision::Denied(_)),
                    "{ctx}: 1µs before retry-after must still be refused, got {early:?}"
                );
                let due = lim.check(probe(retry)).await.unwrap();
                assert!(
                    matches!(due, Decision::Granted(_)),
                    "{ctx}: at retry-after the same request must pass, got {due:?}"
                );
            }
            (Want::Never, Decision::Never(c)) => assert_eq!(c.cost, cost, "{ctx}"),
            _ => panic!("{ctx}: wanted {want:?}"),
        }
    }
}

const S: u64 = 1_000_000;

#[tokio::test]
async fn fixed_window() {
    let rows: &[Row] = &[
        (1, 0, 1, All, Want::Grant(1, 2)),
        (2, 100_000, 2, All, Want::Grant(2, 0)),
        (3, 200_000, 1, All, Want::Deny(800_000)),
        (4, 999_999, 1, All, Want::Deny(1)),
        (5, S, 1, All, Want::Grant(1, 2)),
        (6, S + 1, 4, All, Want::Never),
        (7, S + 100_000, 5, UpTo, Want::Grant(2, 0)),
        (8, S + 200_000, 1, UpTo, Want::Deny(800_000)),
        // An idle day later the old window's state means nothing.
        (9, 86_400 * S, 3, All, Want::Grant(3, 0)),
    ];
    run_table("fixed_window", rule("fixed_window", 3, "1s", None), rows).await;
}

#[tokio::test]
async fn sliding_window_log() {
    let rows: &[Row] = &[
        (1, 0, 1, All, Want::Grant(1, 2)),
        (2, 300_000, 1, All, Want::Grant(1, 1)),
        (3, 600_000, 1, All, Want::Grant(1, 0)),
        (4, 700_000, 1, All, Want::Deny(300_000)),
        (5, S, 1, All, Want::Grant(1, 0)),
        // Needs two entries gone: the second oldest leaves at 1.6 s.
        (6, S, 2, All, Want::Deny(600_000)),
        (7, S, 2, UpTo, Want::Deny(300_000)),
        (8, S + 300_000, 2, UpTo, Want::Grant(1, 0)),
        // Two admissions in the same microsecond are two entries.
        (9, 10 * S, 1, All, Want::Grant(1, 2)),
        (10, 10 * S, 1, All, Want::Grant(1, 1)),
        (11, 10 * S, 1, All, Want::Grant(1, 0)),
        (12, 10 * S, 1, All, Want::Deny(S)),
    ];
    run_table(
        "sliding_window_log",
        rule("sliding_window_log", 3, "1s", None),
        rows,
    )
    .await;
}

#[tokio::test]
async fn sliding_window_counter() {
    let rows: &[Row] = &[
        (1, 0, 3, All, Want::Grant(3, 0)),
        // Next window, once 3·(1 − e) + 1 ≤ 3: e ≥ 1/3 of the window.
        (2, 500_000, 1, All, Want::Deny(833_334)),
        (3, 1_333_333, 1, All, Want::Deny(1)),
        (4, 1_333_334, 1, All, Want::Grant(1, 0)),
        (5, 1_500_000, 2, UpTo, Want::Deny(166_667)),
        (6, 1_666_667, 2, UpTo, Want::Grant(1, 0)),
    ];
    run_table(
        "sliding_window_counter",
        rule("sliding_window_counter", 3, "1s", None),
        rows,
    )
    .await;
}

#[tokio::test]
async fn token_bucket() {
    let rows: &[Row] = &[
        (1, 0, 3, All, Want::Grant(3, 0)),
        (2, 0, 1, All, Want::Deny(333_334)),
        (3, 333_333, 1, All, Want::Deny(1)),
        (4, 333_334, 1, All, Want::Grant(1, 0)),
        (5, 2 * S, 3, All, Want::Grant(3, 0)),
        (6, 2 * S, 4, All, Want::Never),
        (7, 2 * S + 500_000, 5, UpTo, Want::Grant(1, 0)),
    ];
    run_table("token_bucket", rule("token_bucket", 3, "1s", Some(3)), rows).await;
}

#[tokio::test]
async fn leaky_bucket() {
    let rows: &[Row] = &[
        (1, 0, 1, All, Want::GrantAt(1, 1, 0)),
        (2, 0, 1, All, Want::GrantAt(1, 0, 333_334)),
        (3, 0, 1, All, Want::Deny(333_334)),
        (4, 333_334, 1, All, Want::GrantAt(1, 0, 666_667)),
        (5, 333_334, 3, All, Want::Never),
    ];
    run_table("leaky_bucket", rule("leaky_bucket", 3, "1s", Some(2)), rows).await;
}

#[tokio::test]
async fn burst_fill_with_a_50us_period() {
    let rows: &[Row] = &[
        (1, 0, 1, All, Want::Grant(1, 2)),
        (2, 10, 2, All, Want::Grant(2, 0)),
        (3, 20, 1, All, Want::Deny(30)),
        // Refilled to exactly 3 at once: 5 = 2·3 − 1 passed within 40 µs.
        (4, 50, 3, All, Want::Grant(3, 0)),
        (5, 99, 1, All, Want::Deny(1)),
        (6, 100, 1, UpTo, Want::Grant(1, 2)),
        (7, 100, 4, All, Want::Never),
    ];
    run_table("burst_fill", rule("burst_fill", 3, "50us", None), rows).await;
}

#[tokio::test]
async fn gcra() {
    let rows: &[Row] = &[
        (1, 0, 3, All, Want::Grant(3, 0)),
        (2, 0, 1, All, Want::Deny(333_334)),
        (3, 333_334, 1, All, Want::Grant(1, 0)),
        (4, 333_334, 2, UpTo, Want::Deny(333_333)),
        (5, 333_334, 4, All, Want::Never),
    ];
    run_table("gcra", rule("gcra", 3, "1s", Some(3)), rows).await;
}
