//! The Redis commands one decision runs, per call shape and feature set:
//! a deterministic guard on the hot path's cost (issue 37). Wall-clock
//! timings are too noisy here to guard anything; `INFO commandstats`
//! counts every command a script calls, so a change that adds a
//! `redis.call` to a decision moves these counts, on any machine.
//!
//! One private `redis-server` (its counters are the test's alone). Each
//! case is a limiter in state v2 with the loss guard on (the product's
//! defaults), asked for one job at a time by 10 sellers, 20 times each,
//! with rules that never refuse: a busy seller's steady state plus its
//! first writes. The bound per case is its commands per decision, with
//! room for what is paid once per seller or per grain (an expiry set, a
//! trim of the call records) but not for one more command per call.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::{policy, policy_with_sellers, rule};
use throttle_worker::config::{OnStateLoss, SellerConfig, Topology};
use throttle_worker::limiter::{BatchDecision, KeySpace, Limiter, Policy, RedisStore};

const SELLERS: usize = 10;
const CALLS_PER_SELLER: usize = 20;

/// `INFO commandstats` as command → calls, without the client's own
/// commands (the calls of the scripts and what the test itself sends).
fn script_commands(port: u16) -> BTreeMap<String, u64> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "commandstats"])
        .output()
        .expect("redis-cli");
    const CLIENT: [&str; 10] = [
        "fcall", "evalsha", "eval", "function", "config", "info", "ping", "client", "hello",
        "script",
    ];
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            // Subcommands count as `config|resetstat`, `function|load`.
            let command = name.split('|').next().unwrap_or(name);
            (!CLIENT.contains(&command)).then(|| (name.to_owned(), calls))
        })
        .collect()
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A limiter in state v2 with the loss guard on, as the product runs.
async fn limiter(port: u16, prefix: &str, policy: Policy) -> Limiter<RedisStore> {
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), Duration::from_secs(5))
        .await
        .expect("the private redis-server");
    Limiter::new(store, KeySpace::new(prefix), policy, Topology::Single)
        .with_state_loss(OnStateLoss::Wait)
}

/// Commands per decision for `policy`: the whole count and by command.
async fn per_decision(port: u16, case: &str, policy: Policy) -> (f64, BTreeMap<String, u64>) {
    let limiter = limiter(port, case, policy).await;
    // An install whose state was never lost (its epoch long past), or
    // every new seller would be charged a whole use (issue 33's guard).
    let warm = limiter.keys().block_at("warm").key;
    cli(
        port,
        &["SET", &limiter.keys().epoch(Topology::Single, &warm), "1"],
    );
    // Warm: the shape's library loaded.
    limiter
        .acquire_jobs("warm", &[1])
        .await
        .expect("warm-up call");
    cli(port, &["CONFIG", "RESETSTAT"]);
    for round in 0..CALLS_PER_SELLER {
        for s in 0..SELLERS {
            let d = limiter
                .acquire_jobs(&format!("seller-{s}"), &[1])
                .await
                .unwrap_or_else(|e| panic!("{case}: call {round} of seller {s}: {e}"));
            assert!(
                matches!(d, BatchDecision::Granted(_)),
                "{case}: rules that never refuse: {d:?}"
            );
        }
    }
    let by = script_commands(port);
    let total: u64 = by.values().sum();
    (total as f64 / (SELLERS * CALLS_PER_SELLER) as f64, by)
}

/// A gcra rule for everyone, `seller` for each of `names`.
fn every_seller(names: &[String], seller: SellerConfig) -> Policy {
    policy_with_sellers(
        vec![rule("gcra", 10_000, "1m", None)],
        names.iter().map(|n| (n.as_str(), seller.clone())).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_runs_a_bounded_number_of_redis_commands() {
    let server = RedisServer::start();
    let port = server.port;
    // The sliding log keeps an entry per admission (at most 10,000).
    let never = |algorithm: &str| rule(algorithm, 10_000, "1m", None);
    let algorithms = [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "leaky_bucket",
        "burst_fill",
        "gcra",
    ];
    // (case, policy, bound per decision). The plain shape's three commands
    // a call, as many as the minimal gcra script's: TIME, HGETALL (the
    // seller's hash: its state, block, tombstones, records), HSET (its new
    // state and the call's record). Once per new seller, a GET of the loss
    // guard's epoch (its places are unwritten) and a PEXPIRE.
    let mut cases: Vec<(String, Policy, f64)> = algorithms
        .iter()
        .map(|a| (format!("one {a} rule"), policy(vec![never(a)], vec![]), 3.5))
        .collect();
    cases.push((
        "two rules".into(),
        policy(vec![never("gcra"), never("fixed_window")], vec![]),
        3.5,
    ));
    let mut shadow = never("fixed_window");
    shadow.shadow = true;
    // A shadow rule is its own call after the grant: TIME, HGETALL, HSET.
    cases.push((
        "a shadow rule".into(),
        policy(vec![never("gcra"), shadow], vec![]),
        6.5,
    ));
    // A global rule's place is in a hash of its own: one HGETALL and one
    // HSET more.
    cases.push((
        "a global rule".into(),
        policy(vec![never("gcra")], vec![never("gcra")]),
        5.5,
    ));
    let names: Vec<String> = (0..SELLERS).map(|s| format!("seller-{s}")).collect();
    // A cap on calls in flight: the slots' ZCOUNT, ZADD, and their trim
    // and expiry (ZREMRANGEBYSCORE, PTTL, PEXPIRE) on every call; their
    // release is a call of its own, not made here.
    cases.push((
        "max_in_flight".into(),
        every_seller(
            &names,
            SellerConfig {
                max_in_flight: Some(1_000),
                ..SellerConfig::default()
            },
        ),
        8.5,
    ));
    // No rules: TIME, HGETALL (the block and tombstones), no write.
    cases.push((
        "an unlimited seller".into(),
        every_seller(
            &names,
            SellerConfig {
                unlimited: true,
                ..SellerConfig::default()
            },
        ),
        2.5,
    ));

    let mut over = Vec::new();
    for (case, policy, bound) in cases {
        let (per, by) = per_decision(port, &case.replace(' ', "_"), policy).await;
        println!("{case}: {per:.2} commands per decision {by:?}");
        if per > bound {
            over.push(format!("{case}: {per:.2} > {bound} ({by:?})"));
        }
    }
    assert!(
        over.is_empty(),
        "decisions run more Redis commands than their bound:\n{}",
        over.join("\n")
    );
    let libraries = cli(port, &["FUNCTION", "LIST"]);
    assert!(
        libraries.contains("_gcra\n") || libraries.contains("_gcra\r"),
        "the plain gcra call ran its generated shape: {libraries}"
    );
}

/// At startup (and after each reload) the worker loads the generated
/// function of every rule list its limits name, so that no call waits for
/// a `FUNCTION LOAD`: the default's, each tier's, each named seller's.
#[tokio::test]
async fn the_shapes_of_the_limits_in_force_are_loaded_before_any_call() {
    use throttle_worker::config::LimitsConfig;
    let server = RedisServer::start();
    let never = |algorithm: &str| rule(algorithm, 10_000, "1m", None);
    let cfg = LimitsConfig {
        default: vec![never("gcra")],
        tiers: [(
            "bulk".to_owned(),
            vec![never("token_bucket"), never("fixed_window")],
        )]
        .into(),
        sellers: [(
            "paced".to_owned(),
            SellerConfig {
                rules: Some(vec![never("leaky_bucket")]),
                ..SellerConfig::default()
            },
        )]
        .into(),
        ..LimitsConfig::default()
    };
    let policy = Policy::from_config(&cfg).expect("valid limits");
    let limiter = limiter(server.port, "prepared", policy).await;
    limiter.prepare_shapes().await.expect("loaded");
    let libraries = cli(server.port, &["FUNCTION", "LIST"]);
    let mut shapes: Vec<&str> = libraries
        .lines()
        .filter(|l| l.starts_with("throttle_jobs_"))
        .filter_map(|l| l.splitn(4, '_').nth(3))
        .collect();
    shapes.sort_unstable();
    assert_eq!(shapes, ["gcra", "lb", "tb_fw"], "{libraries}");
}
