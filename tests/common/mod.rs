//! Helpers shared by the integration tests: where Redis is, unique key
//! prefixes so that runs never collide, and limiters over literal rules.
#![allow(dead_code)]

pub mod cli;
pub mod cluster;
pub mod procs;
pub mod redis_server;
pub mod worker;

use std::time::Duration;

use throttle_worker::config::{LimitsConfig, RuleConfig, SellerConfig, Topology};
use throttle_worker::limiter::{KeySpace, Limiter, Policy, RedisStore};

/// `REDIS_URL`, defaulting to the loopback server `.ci/run` starts.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A key prefix no other test or run uses.
pub fn unique_prefix(test: &str) -> String {
    format!("test-{test}-{:08x}", rand::random::<u32>())
}

pub fn rule(algorithm: &str, limit: u64, period: &str, burst: Option<u64>) -> RuleConfig {
    RuleConfig {
        algorithm: algorithm.to_owned(),
        limit,
        period: humantime::parse_duration(period).expect("test period"),
        burst,
        shadow: false,
    }
}

/// A policy whose default rules are `rules` and whose global rules are `global`.
pub fn policy(rules: Vec<RuleConfig>, global: Vec<RuleConfig>) -> Policy {
    let cfg = LimitsConfig {
        default: rules,
        global,
        ..Default::default()
    };
    Policy::from_config(&cfg).expect("test policy must be valid")
}

pub fn policy_with_sellers(rules: Vec<RuleConfig>, sellers: Vec<(&str, SellerConfig)>) -> Policy {
    let cfg = LimitsConfig {
        default: rules,
        sellers: sellers
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        ..Default::default()
    };
    Policy::from_config(&cfg).expect("test policy must be valid")
}

pub async fn store() -> RedisStore {
    RedisStore::connect(&redis_url(), Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("integration tests need Redis at {}: {e}", redis_url()))
}

pub async fn limiter(prefix: &str, policy: Policy) -> Limiter<RedisStore> {
    Limiter::new(
        store().await,
        KeySpace::new(prefix),
        policy,
        Topology::Single,
    )
}

pub async fn limiter_with(prefix: &str, policy: Policy, topology: Topology) -> Limiter<RedisStore> {
    Limiter::new(store().await, KeySpace::new(prefix), policy, topology)
}

/// A plain connection for looking at what the scripts wrote.
pub async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// Every key under `prefix`.
pub async fn keys_under(prefix: &str) -> Vec<String> {
    let mut conn = raw().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    keys.sort();
    keys
}

/// A base time well inside one aligned window of every period the tests use.
pub const T0: u64 = 1_700_000_000_000_000 - (1_700_000_000_000_000 % 86_400_000_000);

/// The hash slot Redis Cluster gives each key, as Redis itself computes it
/// (`CLUSTER KEYSLOT`), not as the crate's `hash_tag` thinks. A plain Redis
/// refuses the command ("cluster support disabled"), so a cluster-enabled
/// `redis-server` is started on a free loopback port for the question and
/// stopped after; it needs no slots assigned to answer.
pub async fn cluster_keyslots(keys: &[String]) -> Vec<u16> {
    let (port, bus) = free_port_pair();
    let dir = std::env::temp_dir().join(format!("keyslot-{port}-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut server = std::process::Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--cluster-port", &bus.to_string()])
        .args([
            "--cluster-enabled",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server must be installed");
    let url = format!("redis://127.0.0.1:{port}");
    let mut conn = None;
    for _ in 0..100 {
        if let Ok(c) = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
        {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut conn = conn.expect("cluster-enabled redis-server did not start");
    let mut slots = Vec::new();
    for k in keys {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(k)
            .query_async(&mut conn)
            .await
            .expect("CLUSTER KEYSLOT");
        slots.push(slot);
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    slots
}

/// The sum of every sample of `name` (a full sample name, e.g.
/// `throttle_jobs_received_total`) whose labels include `labels`, as this
/// process' `/metrics` renders it.
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_in(
        &throttle_worker::telemetry::metrics::metrics().render(),
        name,
        labels,
    )
}

/// [`metric`] over a scraped exposition.
pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Two distinct loopback ports free at the time of the call: a cluster
/// node's client port and its bus (`--cluster-port`; the default, the
/// client port + 10,000, may be taken or above 65,535).
pub fn free_port_pair() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    let b = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    let port = |l: &std::net::TcpListener| l.local_addr().expect("local addr").port();
    (port(&a), port(&b))
}

/// A loopback port free at the time of the call (for `http.listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Microseconds since the Unix epoch (the unit of `X-Granted-At` and of
/// Redis' `TIME`).
pub fn unix_us(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_micros() as u64
}

/// The busiest window: the most of `times` (µs, sorted here) that fall
/// within any span shorter than `span_us` (two times exactly `span_us`
/// apart are in different windows, as a sliding log of that period counts
/// them), and the index range of that window in the sorted times, for the
/// failure message. `(0, 0..0)` for no times.
pub fn busiest_window(times: &mut [u64], span_us: u64) -> (usize, std::ops::Range<usize>) {
    times.sort_unstable();
    let (mut best, mut at) = (0, 0..0);
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= span_us {
            lo += 1;
        }
        if hi - lo + 1 > best {
            (best, at) = (hi - lo + 1, lo..hi + 1);
        }
    }
    (best, at)
}

/// Asserts that a property test's generator produced each kind of case it
/// names at least once: a property that never met a kind proved nothing
/// about it. `seen` is the whole tally, for the message.
pub fn assert_covered(context: &str, kinds: &[(&str, u64)], seen: &dyn std::fmt::Debug) {
    for (what, n) in kinds {
        assert!(
            *n > 0,
            "{context}: the generator produced no {what}: {seen:?}"
        );
    }
}
