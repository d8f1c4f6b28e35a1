//! Limiter throughput against a real Redis, with a baseline measured in the
//! same run: `redis-benchmark` driving the very same script with EVALSHA at
//! the same concurrency over the same number of sellers. Prints decisions
//! per second for both and their ratio, per algorithm; then admitted jobs per
//! second when each call asks for up to 64 units, against one unit per call.
//! (Bytes per seller in Redis: `cargo bench --bench memory`.)
//!
//!     REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench limiter
//!
//! Environment: BENCH_SECONDS (per measurement, default 3), BENCH_CALLERS (50),
//! BENCH_SELLERS (10000).

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttle_worker::config::{LimitsConfig, RuleConfig, Topology};
use throttle_worker::limiter::{Algorithm, KeySpace, Limiter, Mode, Policy, RedisStore, Rule};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rule_config(
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
) -> RuleConfig {
    RuleConfig {
        algorithm: algorithm.name().to_owned(),
        limit,
        period,
        burst,
        shadow: false,
    }
}

fn policy(rule: RuleConfig) -> Policy {
    Policy::from_config(&LimitsConfig {
        default: vec![rule],
        ..Default::default()
    })
    .expect("bench rule")
}

/// Decisions (calls) and admitted units per second through the Rust limiter.
async fn ours(
    store: &RedisStore,
    prefix: &str,
    policy: Policy,
    cost: u64,
    mode: Mode,
) -> (f64, f64) {
    let callers = env_u64("BENCH_CALLERS", 50);
    let sellers = env_u64("BENCH_SELLERS", 10_000);
    let run = Duration::from_secs(env_u64("BENCH_SECONDS", 3));
    let lim = Arc::new(Limiter::new(
        store.clone(),
        KeySpace::new(prefix),
        policy,
        Topology::Single,
    ));
    let calls = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (lim, calls, admitted) = (lim.clone(), calls.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while start.elapsed() < run {
                let seller = format!("s{}", i % sellers);
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407)
                    % (1 << 40);
                let d = lim
                    .acquire(&seller, cost, mode)
                    .await
                    .expect("limiter call");
                calls.fetch_add(1, Ordering::Relaxed);
                admitted.fetch_add(d.granted(), Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let secs = start.elapsed().as_secs_f64();
    (
        calls.load(Ordering::Relaxed) as f64 / secs,
        admitted.load(Ordering::Relaxed) as f64 / secs,
    )
}

/// The same script, the same rule, driven by redis-benchmark: one jobs
/// call of one job of cost 1 (`lua/jobs.lua`), as [`Limiter::acquire`]
/// sends it, the rule at place r0 of the seller's hash. (redis-benchmark
/// draws each `__rand_int__` apart, so its call names two sellers' hashes,
/// the block's and the rule's, where ours names one.)
fn baseline(
    host: &str,
    port: &str,
    sha: &str,
    prefix: &str,
    rule: &Rule,
    rate_hint: f64,
) -> Option<f64> {
    let callers = env_u64("BENCH_CALLERS", 50).to_string();
    let sellers = env_u64("BENCH_SELLERS", 10_000).to_string();
    let n = ((rate_hint * env_u64("BENCH_SECONDS", 3) as f64) as u64)
        .max(20_000)
        .to_string();
    let out = Command::new("redis-benchmark")
        .args([
            "-h", host, "-p", port, "-c", &callers, "-n", &n, "-r", &sellers, "-q",
        ])
        .args(["EVALSHA", sha, "2"])
        .arg(format!("{prefix}:{{s__rand_int__}}:v2"))
        .arg(format!("{prefix}:{{s__rand_int__}}:v2"))
        .args([
            "jobs",
            "",
            "1",
            "b__rand_int__",
            "1",
            "f",
            "1",
            rule.algorithm().name(),
        ])
        .args([
            rule.limit().to_string(),
            rule.period_us().to_string(),
            rule.burst().to_string(),
            "r0".to_owned(),
            String::new(),
        ])
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("redis-benchmark not runnable ({e}); install redis-tools for the baseline");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 61236.99 requests per second, p50=0.399 msec"
    let rps = text
        .split("requests per second")
        .next()
        .and_then(|head| head.rsplit([' ', '\r']).find(|w| !w.is_empty()))
        .and_then(|w| w.parse::<f64>().ok());
    if rps.is_none() {
        eprintln!("could not read redis-benchmark output: {text}");
    }
    rps
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let hostport = url
        .trim_start_matches("redis://")
        .rsplit('@')
        .next()
        .unwrap_or("127.0.0.1:6379");
    let hostport = hostport.split('/').next().unwrap_or(hostport);
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "6379"));
    let store = RedisStore::connect(&url, Duration::from_secs(5))
        .await
        .expect("Redis for the benchmark");
    // The store calls the limiter as a Function where Redis has them and
    // loads the EVAL script only on a NOSCRIPT: load it for the baseline's
    // EVALSHA.
    let mut conn = redis::Client::open(url.as_str())
        .expect("Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis for the benchmark");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(throttle_worker::limiter::script::LIMITER_LUA)
        .query_async(&mut conn)
        .await
        .expect("SCRIPT LOAD of the limiter");
    assert_eq!(sha, store.limiter_sha(), "the store's SHA of the limiter");
    let run = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    println!(
        "limiter benchmark: {} callers, {} sellers, {} s per measurement, Redis {}:{}",
        env_u64("BENCH_CALLERS", 50),
        env_u64("BENCH_SELLERS", 10_000),
        env_u64("BENCH_SECONDS", 3),
        host,
        port
    );
    println!(
        "{:<24} {:>14} {:>18} {:>7}",
        "algorithm", "ours (dec/s)", "redis-benchmark", "ratio"
    );
    for algorithm in Algorithm::ALL {
        // 100 per minute per seller, as in production; burst = limit.
        let rc = rule_config(algorithm, 100, Duration::from_secs(60), None);
        let rule = Rule::new(algorithm, 100, Duration::from_secs(60), None).expect("rule");
        let prefix = format!("bench-{run}-{algorithm}");
        let (ours_rps, _) = ours(&store, &prefix, policy(rc), 1, Mode::AllOrNothing).await;
        let base = baseline(host, port, &sha, &format!("{prefix}-rb"), &rule, ours_rps);
        match base {
            Some(b) => println!(
                "{:<24} {:>14.0} {:>18.0} {:>7.2}",
                algorithm.name(),
                ours_rps,
                b,
                ours_rps / b
            ),
            None => println!(
                "{:<24} {:>14.0} {:>18} {:>7}",
                algorithm.name(),
                ours_rps,
                "-",
                "-"
            ),
        }
    }
    println!("\ngrant up to 64 units per call vs 1 per call (admitted jobs/s; rule: 10000 per second per seller)");
    println!(
        "{:<24} {:>14} {:>14} {:>7}",
        "algorithm", "1 per call", "up to 64", "ratio"
    );
    for algorithm in [
        Algorithm::SlidingWindowLog,
        Algorithm::Gcra,
        Algorithm::TokenBucket,
    ] {
        let rc = || rule_config(algorithm, 10_000, Duration::from_secs(1), None);
        let (_, one) = ours(
            &store,
            &format!("bench-{run}-{algorithm}-1"),
            policy(rc()),
            1,
            Mode::UpTo,
        )
        .await;
        let (_, many) = ours(
            &store,
            &format!("bench-{run}-{algorithm}-64"),
            policy(rc()),
            64,
            Mode::UpTo,
        )
        .await;
        println!(
            "{:<24} {:>14.0} {:>14.0} {:>7.2}",
            algorithm.name(),
            one,
            many,
            many / one
        );
    }
    println!("\n(keys of this run are under bench-{run}-*; they expire within a minute)");
}
