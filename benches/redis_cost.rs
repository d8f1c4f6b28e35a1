//! Redis' own CPU per limiter decision and per admitted job, each figure
//! next to a baseline measured in the same run on the same private
//! `redis-server` (issue 10). Machines here are noisy: read the ratios.
//!
//!     cargo bench --bench redis_cost              # about 6 minutes
//!     cargo bench --bench redis_cost -- --quick   # under 2 minutes
//!
//! 1. Script cost per algorithm, allow path, one rule: a load like
//!    `redis-benchmark -c 50 -P 16 -r 10000` (50 connections, pipelines of
//!    16, 10,000 random sellers; see `usec_per_call`) drives a minimal
//!    one-algorithm script (the baselines in
//!    `benches/minimal/`), and one decision of the limiter (a jobs call of
//!    one job of cost 1, without the loss guard) as a Functions library
//!    (FCALL) and as an EVAL script (EVALSHA). Redis' CPU per call is
//!    `usec_per_call` from `INFO commandstats`.
//! 2. Per admitted job through the Rust limiter, 10,000 sellers, many
//!    concurrent callers each asking for one job: without coalescing (one
//!    call per ask) and with the coalescer at several windows. Prints jobs/s,
//!    Redis calls and Redis µs per admitted job, and decision latency p50/p99.
//!
//! 3. Decision latency at fixed offered loads below saturation (open loop),
//!    without coalescing and with the coalescer at the same windows:
//!    p50/p99/p99.9 and what coalescing adds.
//!
//!    After part 1, for gcra, two design prototypes (`benches/prototype/`): the
//!    same decision with one key per seller and straight-line code, as a
//!    hash and as one string, next to the minimal script and ours, to show
//!    what that change of key layout would buy.
//!
//! With `REDIS_CELL_MODULE=/path/to/libredis_cell.so` (redis-cell, the
//! native GCRA module, built from its repository) the private server loads
//! it and both parts add `CL.THROTTLE` as a reference, measured in the same
//! run: its µs per call under the same load, and its
//! admitted jobs/s and µs per job with the same callers, one call per ask.
//!
//! Environment: BENCH_CALLERS (256), BENCH_SECONDS (5; 2 with --quick),
//! BENCH_REQUESTS (calls per figure of part 1: 200,000; 60,000 with
//! --quick), BENCH_ROUNDS (1: part 1's figures are each the least of this
//! many runs, taken in turn), REDIS_CELL_MODULE (unset), BENCH_REDIS_CPUS
//! (unset: a CPU list for `taskset -cp`; the private redis-server is moved
//! there once started), BENCH_BEFORE_LUA (unset: a directory holding an
//! earlier `lua/`, e.g. `git archive HEAD~3 lua | tar -x -C /tmp/before`;
//! parts 1 and 1c add it as a column, measured in the same run),
//! BENCH_ONLY=jobs (unset: run only part 1c, the product's jobs call,
//! general and generated; `coalesced`: only part 2, through the general
//! function and through the generated shapes), BENCH_CPU (unset: part 1
//! reads redis-server's CPU per call instead of `usec_per_call`; see
//! `usec_per_call`).
//!
//! On a shared machine, pin Redis and the load to different cores, so that
//! the figures repeat (BENCHMARKS.md 1a):
//!
//!     BENCH_REDIS_CPUS=0 BENCH_ROUNDS=3 taskset -c 1 cargo bench --bench redis_cost -- --quick

#[path = "../tests/common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use throttle_worker::config::{LimitsConfig, RuleConfig, Topology};
use throttle_worker::limiter::shape::{Shape, ShapeLibrary};
use throttle_worker::limiter::{
    Algorithm, BatchDecision, CoalesceSettings, Coalescer, KeySpace, Limiter, Policy, RedisStore,
    Rule,
};

const SELLERS: u64 = 10_000;
const PREFIX: &str = "tw";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `redis-cli -p PORT args…`, its output.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (redis-tools) must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `SCRIPT LOAD` of a file's text; its SHA.
fn script_load(port: u16, text: &str) -> String {
    cli(port, &["SCRIPT", "LOAD", text]).trim().to_owned()
}

/// (calls, usec) of one command in `INFO commandstats`.
fn commandstat(port: u16, command: &str) -> (u64, u64) {
    let info = cli(port, &["INFO", "commandstats"]);
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")));
    let field = |name: &str| {
        line.and_then(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix(name)))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("usec="))
}

/// Redis µs per call of `args` (a command and its arguments) under load:
/// 50 connections, each with a pipeline of 16 calls in flight, `requests`
/// calls in all (redis-benchmark's `-c 50 -P 16`). In each call every
/// `__rand_int__` stands for the same random seller out of 10,000 and
/// `__id__` for a number unique in the run. (redis-benchmark draws each
/// `__rand_int__` of a command apart, so a call named two sellers'
/// hashes, the block's and the rule's: two HGETALLs a call.) Panics when a
/// call failed.
///
/// With `BENCH_CPU` set, the figure is instead the CPU time of
/// redis-server's main thread per call (`/proc/<pid>/schedstat`): it counts
/// reading and answering the call too (a constant few µs), but not the time
/// Redis waited for a core, which `usec_per_call` counts when other work
/// shares the machine.
fn usec_per_call(port: u16, requests: u64, command: &str, args: &[String]) -> f64 {
    cli(port, &["FLUSHALL"]);
    // An install whose state was never lost (the loss guard's epoch long
    // past): otherwise every seller's first call in the first period would
    // be charged a whole use (issue 33's guard), not what a fleet pays.
    cli(port, &["SET", &format!("{PREFIX}:epoch"), "1"]);
    cli(port, &["CONFIG", "RESETSTAT"]);
    let cpu = std::env::var_os("BENCH_CPU").map(|_| server_pid(port));
    let cpu_before = cpu.as_deref().map(cpu_ns);
    let url = format!("redis://127.0.0.1:{port}");
    let owned = args.to_vec();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("load runtime")
            .block_on(load(&url, requests, &owned))
    })
    .join()
    .expect("load thread");
    let (calls, usec) = commandstat(port, command);
    assert!(calls > 0, "no {command} call was made: {args:?}");
    let failed = commandstat_field(port, command, "failed_calls=");
    assert_eq!(
        failed, 0,
        "{failed} of {calls} {command} calls failed: {args:?}"
    );
    match (cpu.as_deref(), cpu_before) {
        (Some(pid), Some(before)) => (cpu_ns(pid) - before) as f64 / 1000.0 / calls as f64,
        _ => usec as f64 / calls as f64,
    }
}

/// redis-server's process id (`INFO server`).
fn server_pid(port: u16) -> String {
    cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(|p| p.trim().to_owned())
        .expect("INFO server names the process")
}

/// CPU time (ns) of a process' main thread so far.
fn cpu_ns(pid: &str) -> u64 {
    let path = format!("/proc/{pid}/schedstat");
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("{path} unreadable"))
}

/// The load of [`usec_per_call`].
async fn load(url: &str, requests: u64, args: &[String]) {
    const CONNECTIONS: u64 = 50;
    const PIPELINE: u64 = 16;
    let client = redis::Client::open(url).expect("client");
    let next_id = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("load connection");
        let (args, next_id) = (args.to_vec(), next_id.clone());
        let share = requests / CONNECTIONS + u64::from(c < requests % CONNECTIONS);
        tasks.push(tokio::spawn(async move {
            let mut x = (c + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut left = share;
            while left > 0 {
                let mut pipe = redis::pipe();
                for _ in 0..left.min(PIPELINE) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let seller = format!("{:012}", x % SELLERS);
                    let id = next_id.fetch_add(1, Ordering::Relaxed).to_string();
                    let mut cmd = redis::cmd(&args[0]);
                    for a in &args[1..] {
                        cmd.arg(a.replace("__rand_int__", &seller).replace("__id__", &id));
                    }
                    pipe.add_command(cmd);
                }
                // Errors are counted by Redis (failed_calls) and checked after.
                let _: Result<redis::Value, _> = pipe.query_async(&mut conn).await;
                left -= left.min(PIPELINE);
            }
        }));
    }
    for t in tasks {
        t.await.expect("load task");
    }
}

/// One integer field (`name=`, e.g. `failed_calls=`) of a command's line in
/// `INFO commandstats`.
fn commandstat_field(port: u16, command: &str, name: &str) -> u64 {
    let info = cli(port, &["INFO", "commandstats"]);
    info.lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .and_then(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix(name)))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// Moves the redis-server on `port` (its `process_id`, all its threads) to
/// the CPUs `cpus` (`taskset -a -cp`).
fn pin(port: u16, cpus: &str) {
    let pid = server_pid(port);
    let ok = Command::new("taskset")
        .args(["-a", "-cp", cpus, &pid])
        .output()
        .expect("taskset (util-linux) must be installed")
        .status
        .success();
    assert!(ok, "taskset -a -cp {cpus} {pid} failed");
}

fn rule_config(algorithm: Algorithm, limit: u64, period: Duration) -> RuleConfig {
    RuleConfig {
        algorithm: algorithm.name().to_owned(),
        limit,
        period,
        burst: None,
        shadow: false,
    }
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// The minimal script that stands for `algorithm`, its SHA and arguments.
fn minimal(port: u16, algorithm: Algorithm, rule: &Rule) -> (&'static str, Vec<String>) {
    let key = format!("min:{{s__rand_int__}}:{}", algorithm.name());
    let period_ms = rule.period_us() / 1000;
    match algorithm {
        Algorithm::Gcra | Algorithm::LeakyBucket => (
            "gcra",
            vec![
                script_load(port, include_str!("minimal/gcra.lua")),
                s(1),
                key,
                s(1),
                s(u64::MAX >> 12),
            ],
        ),
        Algorithm::TokenBucket => (
            "token_bucket",
            vec![
                script_load(port, include_str!("minimal/token_bucket.lua")),
                s(1),
                key,
                s(1_000_000),
                s(rule.limit()),
                s(1),
                s(period_ms),
            ],
        ),
        Algorithm::SlidingWindowLog => (
            "sliding_window_log",
            vec![
                script_load(port, include_str!("minimal/sliding_window_log.lua")),
                s(1),
                key,
                s(1_000_000),
                s(rule.period_us()),
                s(rule.limit()),
                s("m__id__"),
                s(period_ms),
            ],
        ),
        _ => (
            "fixed_window",
            vec![
                script_load(port, include_str!("minimal/fixed_window.lua")),
                s(1),
                key,
                s(rule.limit()),
                s(period_ms),
            ],
        ),
    }
}

/// The limiter's KEYS and ARGV for one decision of one unit: a jobs call
/// of one job of cost 1 (`lua/jobs.lua`) over the seller's one hash, the
/// rule at place r0, on Redis' clock, without the loss guard (part 1c has
/// the call as the product sends it).
fn ours(rule: &Rule) -> Vec<String> {
    let hash = format!("{PREFIX}:{{s__rand_int__}}:v2");
    vec![
        s(2),
        s(&hash),
        s(&hash),
        s("jobs"),
        s(""),
        s(1),
        s("b__id__"),
        s(1),
        s("f"),
        s(1),
        s(rule.algorithm().name()),
        s(rule.limit()),
        s(rule.period_us()),
        s(rule.burst()),
        s("r0"),
        s(""),
    ]
}

/// CL.THROTTLE arguments that never refuse: a burst and a rate far above
/// the load, one unit per call.
fn cell_args(key: &str) -> Vec<String> {
    vec![
        s("CL.THROTTLE"),
        s(key),
        s(1_000_000),
        s(50_000_000),
        s(60),
        s(1),
    ]
}

/// Part 1's table; returns ours (FCALL) µs per gcra decision. `deny`: one
/// unit a minute per seller, so all but a seller's first call are refused
/// (about 5 in 6 at 60,000 requests over 10,000 sellers). Each figure is
/// the least of `rounds` runs, the rows of an algorithm run in turn.
/// `before`: the FCALL name of an earlier library (`BENCH_BEFORE_LUA`),
/// which gets a column of its own.
fn script_cost(
    port: u16,
    store_fn: &str,
    before: Option<&str>,
    requests: u64,
    rounds: u64,
    deny: bool,
) -> f64 {
    let path = if deny {
        "deny path (mostly)"
    } else {
        "allow path"
    };
    println!("\n## 1. Redis µs per decision, {path}, one rule\n");
    println!(
        "50 connections, pipelines of 16, 10,000 random sellers, {requests} calls, least of {rounds} run(s); {}.\n",
        if std::env::var_os("BENCH_CPU").is_some() {
            "redis-server's CPU per call (BENCH_CPU: /proc schedstat, reading and answering included)"
        } else {
            "Redis `usec_per_call` from INFO commandstats"
        }
    );
    let extra = if before.is_some() {
        " before µs | ratio |"
    } else {
        ""
    };
    println!("| algorithm | minimal script (baseline) | µs | ours, FCALL µs | ratio | ours, EVALSHA µs | ratio |{extra}");
    println!(
        "|---|---|---:|---:|---:|---:|---:|{}",
        if before.is_some() { "---:|---:|" } else { "" }
    );
    let eval_sha = script_load(port, throttle_worker::limiter::script::LIMITER_LUA);
    let mut gcra = f64::NAN;
    for algorithm in Algorithm::ALL {
        // Never refuses: the allow path is what a busy fleet pays.
        let limit = if deny {
            1
        } else if algorithm == Algorithm::SlidingWindowLog {
            10_000
        } else {
            50_000_000
        };
        let rule = Rule::new(algorithm, limit, Duration::from_secs(60), None).expect("bench rule");
        let (min_name, min_args) = minimal(port, algorithm, &rule);
        let fcall = |function: &str, args: Vec<String>| {
            let mut call = vec![s("FCALL"), s(function)];
            call.extend(args);
            ("fcall", call)
        };
        let mut evalsha = vec![s("EVALSHA"), eval_sha.clone()];
        evalsha.extend(ours(&rule));
        let mut rows = vec![
            ("evalsha", [vec![s("EVALSHA")], min_args].concat()),
            fcall(store_fn, ours(&rule)),
            ("evalsha", evalsha),
        ];
        if let Some(before) = before {
            rows.push(fcall(before, ours(&rule)));
        }
        let mut best = vec![f64::INFINITY; rows.len()];
        for _ in 0..rounds.max(1) {
            for (b, (command, args)) in best.iter_mut().zip(&rows) {
                *b = b.min(usec_per_call(port, requests, command, args));
            }
        }
        let base = best[0];
        if algorithm == Algorithm::Gcra {
            gcra = best[1];
        }
        let cells: String = best[1..]
            .iter()
            .map(|v| format!(" {v:.2} | {:.2} |", v / base))
            .collect();
        println!("| {} | {min_name} | {base:.2} |{cells}", algorithm.name());
    }
    gcra
}

/// KEYS and ARGV of a jobs call as the product sends it (one job of cost
/// 1; the seller's hash, the loss guard's epoch), on Redis' clock, with the
/// record's life and the guard `wait`.
fn jobs_args(rule: &Rule) -> Vec<String> {
    let hash = format!("{PREFIX}:{{s__rand_int__}}:v2");
    vec![
        s(3),
        s(&hash),
        s(&hash),
        format!("{PREFIX}:epoch"),
        s("jobs"),
        s(""),
        s(1),
        s("j__id__"),
        s(1),
        s("f"),
        s(1),
        s(rule.algorithm().name()),
        s(rule.limit()),
        s(rule.period_us()),
        s(rule.burst()),
        s("r0"),
        s(""),
        s(""),
        s(5_000_000),
        s("wait"),
    ]
}

/// [`jobs_args`] as versions before issue 37 took them: the seller's
/// call records' key after the hash.
fn jobs_args_before(rule: &Rule) -> Vec<String> {
    let mut args = jobs_args(rule);
    args[0] = s(4);
    args.insert(3, format!("{PREFIX}:{{s__rand_int__}}:calls"));
    args
}

/// Part 1c: the jobs call as the product sends it (its record, the loss
/// guard), through the general function and through the
/// generated function of its shape (`limiter::shape`), beside the minimal
/// script of the same algorithm; allow and deny paths. Each figure the
/// least of `rounds` runs, the rows of an algorithm in turn.
fn jobs_cost(port: u16, general: &str, before: Option<&str>, requests: u64, rounds: u64) {
    println!("\n## 1c. The product's jobs call (call record, loss guard), general function and generated shape\n");
    println!("50 connections, pipelines of 16, 10,000 random sellers, {requests} calls, least of {rounds} run(s); Redis `usec_per_call`.\n");
    let (head, rule) = if before.is_some() {
        (" before µs | ratio |", "---:|---:|")
    } else {
        ("", "")
    };
    println!("| algorithm | allow: minimal µs |{head} general µs | ratio | shape µs | ratio | deny: minimal µs |{head} general µs | ratio | shape µs | ratio |");
    println!("|---|---:|{rule}---:|---:|---:|---:|---:|{rule}---:|---:|---:|---:|");
    for algorithm in Algorithm::ALL {
        let mut cells = String::new();
        for deny in [false, true] {
            let limit = if deny {
                1
            } else if algorithm == Algorithm::SlidingWindowLog {
                10_000
            } else {
                50_000_000
            };
            let rule =
                Rule::new(algorithm, limit, Duration::from_secs(60), None).expect("bench rule");
            let (_, min_args) = minimal(port, algorithm, &rule);
            let lib = ShapeLibrary::new(&Shape::new(vec![algorithm]).expect("one rule"));
            cli(port, &["FUNCTION", "LOAD", "REPLACE", &lib.code]);
            let fcall = |function: &str| {
                let mut call = vec![s("FCALL"), s(function)];
                call.extend(jobs_args(&rule));
                call
            };
            let mut rows = vec![
                ("evalsha", [vec![s("EVALSHA")], min_args].concat()),
                ("fcall", fcall(general)),
                ("fcall", fcall(&lib.function)),
            ];
            if let Some(before) = before {
                // The version before named the records' key too.
                let mut call = vec![s("FCALL"), s(before)];
                call.extend(jobs_args_before(&rule));
                rows.push(("fcall", call));
            }
            let mut best = vec![f64::INFINITY; rows.len()];
            for _ in 0..rounds.max(1) {
                for (b, (command, args)) in best.iter_mut().zip(&rows) {
                    *b = b.min(usec_per_call(port, requests, command, args));
                }
            }
            cells.push_str(&format!(" {:.2} |", best[0]));
            if before.is_some() {
                cells.push_str(&format!(" {:.2} | {:.2} |", best[3], best[3] / best[0]));
            }
            cells.push_str(&format!(
                " {:.2} | {:.2} | {:.2} | {:.2} |",
                best[1],
                best[1] / best[0],
                best[2],
                best[2] / best[0]
            ));
        }
        println!("| {} |{cells}", algorithm.name());
    }
}

/// The limiter's Lua of an earlier version, from a directory holding its
/// `lua/` (`git archive <rev> lua | tar -x -C DIR`), loaded beside today's
/// as a Functions library of its own; its FCALL name. The files are joined
/// in the order of `src/limiter/script.rs`.
fn load_before(port: u16, dir: &str) -> String {
    const ORDER: [&str; 13] = [
        "common",
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "leaky_bucket",
        "burst_fill",
        "gcra",
        "slots",
        "calls",
        "jobs",
        "limiter",
        "block",
    ];
    let body: String = ORDER
        .iter()
        .filter_map(|f| {
            // Older versions have no slots.lua or calls.lua.
            let path = format!("{dir}/lua/{f}.lua");
            std::fs::read_to_string(&path).ok()
        })
        .collect();
    let code = format!(
        "#!lua name=bench_before\n{body}\nredis.register_function('bench_before', limiter_call)\n"
    );
    let loaded = cli(port, &["FUNCTION", "LOAD", "REPLACE", &code]);
    assert_eq!(loaded.trim(), "bench_before", "FUNCTION LOAD of {dir}");
    s("bench_before")
}

/// The one-key prototypes of gcra against the minimal script and ours
/// (FCALL), each under part 1's load, twice in turn (the spread shows the
/// noise).
fn prototypes(port: u16, store_fn: &str, requests: u64) {
    println!(
        "\n### gcra: one key per seller, straight-line (design prototypes, benches/prototype/)\n"
    );
    println!("| run | minimal µs | one-key hash µs | ratio | one-key string µs | ratio | ours, FCALL µs | ratio |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let rule = Rule::new(Algorithm::Gcra, 50_000_000, Duration::from_secs(60), None).expect("rule");
    let (_, min_args) = minimal(port, Algorithm::Gcra, &rule);
    let mut min = vec![s("EVALSHA")];
    min.extend(min_args);
    let proto = |text: &str, key: &str| {
        vec![
            s("EVALSHA"),
            script_load(port, text),
            s(1),
            s(key),
            s(rule.limit()),
            s(rule.period_us()),
            s(rule.burst()),
            s(1),
        ]
    };
    let hash = proto(
        include_str!("prototype/gcra_one_key_hash.lua"),
        "h:{s__rand_int__}",
    );
    let string = proto(
        include_str!("prototype/gcra_one_key_string.lua"),
        "s:{s__rand_int__}",
    );
    let mut fcall = vec![s("FCALL"), s(store_fn)];
    fcall.extend(ours(&rule));
    for run in 1..=2 {
        let base = usec_per_call(port, requests, "evalsha", &min);
        let h = usec_per_call(port, requests, "evalsha", &hash);
        let st = usec_per_call(port, requests, "evalsha", &string);
        let o = usec_per_call(port, requests, "fcall", &fcall);
        println!(
            "| {run} | {base:.2} | {h:.2} | {:.2} | {st:.2} | {:.2} | {o:.2} | {:.2} |",
            h / base,
            st / base,
            o / base
        );
        cli(port, &["FLUSHALL"]);
    }
}

/// redis-cell's CL.THROTTLE under part 1's load, next to ours for gcra.
fn cell_cost(port: u16, requests: u64, ours_gcra: f64) {
    let cell = usec_per_call(
        port,
        requests,
        "cl.throttle",
        &cell_args("cell:{s__rand_int__}"),
    );
    println!(
        "\nredis-cell `CL.THROTTLE` (native GCRA, same load): {cell:.2} µs per call; ours, gcra by FCALL: {ours_gcra:.2} µs, {:.2}× CL.THROTTLE.",
        ours_gcra / cell
    );
    cli(port, &["FLUSHALL"]);
}

/// What one run of many callers gave.
struct Run {
    jobs_per_s: f64,
    calls_per_job: f64,
    usec_per_job: f64,
    p50_us: u64,
    p99_us: u64,
}

/// `callers` tasks, each asking for one job of a random seller in a loop,
/// through `ask`, for `secs`.
async fn drive<F, Fut>(port: u16, command: &str, callers: u64, secs: u64, ask: F) -> Run
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send,
{
    cli(port, &["CONFIG", "RESETSTAT"]);
    let ask = Arc::new(ask);
    let admitted = Arc::new(AtomicU64::new(0));
    let run = Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (ask, admitted) = (ask.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            let mut x = c.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut lat = Vec::new();
            while start.elapsed() < run {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let seller = format!("s{}", x % SELLERS);
                let t = Instant::now();
                let units = ask(seller).await;
                lat.push(t.elapsed().as_micros() as u64);
                admitted.fetch_add(units, Ordering::Relaxed);
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("caller"));
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)));
    let jobs = admitted.load(Ordering::Relaxed).max(1) as f64;
    let (calls, usec) = commandstat(port, command);
    Run {
        jobs_per_s: jobs / secs,
        calls_per_job: calls as f64 / jobs,
        usec_per_job: usec as f64 / jobs,
        p50_us: pct(0.50).copied().unwrap_or(0),
        p99_us: pct(0.99).copied().unwrap_or(0),
    }
}

/// The coalescing windows parts 2 and 3 compare with one call per ask.
const WINDOWS: [(&str, Duration); 3] = [
    ("coalesced, one turn (default)", Duration::ZERO),
    ("coalesced, 100 µs", Duration::from_micros(100)),
    ("coalesced, 1 ms", Duration::from_millis(1)),
];

/// An ask for one job of a seller; its admitted units.
type AskFn = Box<dyn Fn(String) -> BoxFuture<'static, u64> + Send + Sync>;

/// One limiter call per ask (the baseline of parts 2 and 3).
fn direct(limiter: &Arc<Limiter<RedisStore>>) -> AskFn {
    let limiter = limiter.clone();
    Box::new(move |seller| {
        let limiter = limiter.clone();
        Box::pin(async move {
            limiter
                .acquire_jobs(&seller, &[1])
                .await
                .map(units)
                .unwrap_or(0)
        })
    })
}

/// Asks through a coalescer with `window`.
fn coalesced(limiter: &Arc<Limiter<RedisStore>>, window: Duration) -> AskFn {
    let co = Coalescer::start(
        limiter.clone(),
        CoalesceSettings {
            window,
            ..CoalesceSettings::default()
        },
    );
    Box::new(move |seller| {
        let co = co.clone();
        Box::pin(async move { co.acquire_jobs(&seller, &[1]).await.map(units).unwrap_or(0) })
    })
}

/// Latency percentiles (µs) of asks sent at a fixed rate, each in a task of
/// its own, so a slow answer never delays the next ask (open loop: the
/// offered load stays `rate` whatever the latency).
struct Paced {
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    asks: usize,
}

async fn paced<F, Fut>(rate: u64, secs: u64, ask: F) -> Paced
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send,
{
    let ask = Arc::new(ask);
    let total = rate * secs;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    // tokio's timer has a millisecond grain: missed ticks fire together, so
    // asks leave in bursts of up to rate/1000, as a consumer's batches do.
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(total as usize);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..total {
        tick.tick().await;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let seller = format!("s{}", x % SELLERS);
        let ask = ask.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            ask(seller).await;
            t.elapsed().as_micros() as u64
        }));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        lat.push(t.await.expect("paced ask"));
    }
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Paced {
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        asks: lat.len(),
    }
}

/// Part 3: the latency of one decision at offered loads Redis keeps up
/// with, and what coalescing adds to it (issue 10, target 5). At
/// saturation (part 2) latency is queueing and says little about the call.
async fn latency(limiter: &Arc<Limiter<RedisStore>>, rates: &[u64], secs: u64) {
    println!("\n## 3. Decision latency at a fixed offered load, {SELLERS} sellers\n");
    println!("Open loop: asks leave at the rate whatever the answers take (gcra, never refusing), {secs} s per row.\n");
    println!("| asks/s | mode | asks | p50 µs | p99 µs | p99.9 µs | p50 added | p99 added |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for &rate in rates {
        let base = paced(rate, secs, direct(limiter)).await;
        let row = |name: &str, r: &Paced| {
            println!(
                "| {rate} | {name} | {} | {} | {} | {} | {:+} | {:+} |",
                r.asks,
                r.p50_us,
                r.p99_us,
                r.p999_us,
                r.p50_us as i64 - base.p50_us as i64,
                r.p99_us as i64 - base.p99_us as i64
            )
        };
        row("no coalescing (baseline)", &base);
        for (name, window) in WINDOWS {
            row(name, &paced(rate, secs, coalesced(limiter, window)).await);
        }
    }
}

fn units(d: BatchDecision) -> u64 {
    match d {
        BatchDecision::Granted(g) => g.units,
        _ => 0,
    }
}

/// The limiter of parts 2 and 3: every seller one gcra rule that never
/// refuses at the bench's rates.
fn never_refusing(store: &RedisStore) -> Arc<Limiter<RedisStore>> {
    let policy = Policy::from_config(&LimitsConfig {
        default: vec![rule_config(
            Algorithm::Gcra,
            50_000_000,
            Duration::from_secs(60),
        )],
        ..Default::default()
    })
    .expect("bench policy");
    Arc::new(Limiter::new(
        store.clone(),
        KeySpace::new(PREFIX),
        policy,
        Topology::Single,
    ))
}

async fn coalescing(
    port: u16,
    limiter: &Arc<Limiter<RedisStore>>,
    callers: u64,
    secs: u64,
    cell: bool,
) {
    println!("\n## 2. Redis per admitted job, {SELLERS} sellers, {callers} concurrent callers\n");
    println!("Each caller asks for one job of a random seller (gcra, never refusing), {secs} s per row.\n");
    println!(
        "| mode | jobs/s | ratio | Redis calls/job | Redis µs/job | ratio | p50 µs | p99 µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let base = drive(port, "fcall", callers, secs, direct(limiter)).await;
    let row = |name: &str, r: &Run| {
        println!(
            "| {name} | {:.0} | {:.2} | {:.3} | {:.2} | {:.2} | {} | {} |",
            r.jobs_per_s,
            r.jobs_per_s / base.jobs_per_s,
            r.calls_per_job,
            r.usec_per_job,
            r.usec_per_job / base.usec_per_job,
            r.p50_us,
            r.p99_us
        )
    };
    row("no coalescing (baseline)", &base);
    for (name, window) in WINDOWS {
        row(
            name,
            &drive(port, "fcall", callers, secs, coalesced(limiter, window)).await,
        );
    }
    if !cell {
        println!("\n(redis-cell's CL.THROTTLE, from the issue's measurement on this kind of machine: ~2.6 µs per call, ~380k calls/s; set REDIS_CELL_MODULE to measure it here.)");
        return;
    }
    // The same callers, each ask one CL.THROTTLE over one multiplexed
    // connection, as the limiter's own calls go.
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("client");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection for CL.THROTTLE");
    let r = drive(port, "cl.throttle", callers, secs, move |seller| {
        let mut conn = conn.clone();
        async move {
            let mut cmd = redis::cmd("CL.THROTTLE");
            for a in &cell_args(&format!("cell:{{{seller}}}"))[1..] {
                cmd.arg(a);
            }
            let reply: Vec<i64> = cmd.query_async(&mut conn).await.unwrap_or_default();
            u64::from(reply.first() == Some(&0))
        }
    })
    .await;
    row("redis-cell CL.THROTTLE, one call per ask (reference)", &r);
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let requests = env_u64("BENCH_REQUESTS", if quick { 60_000 } else { 200_000 });
    let secs = env_u64("BENCH_SECONDS", if quick { 2 } else { 5 });
    let callers = env_u64("BENCH_CALLERS", 256);
    let cell = std::env::var("REDIS_CELL_MODULE").ok();
    let redis = match &cell {
        Some(module) => redis_server::RedisServer::start_with(&[s("--loadmodule"), s(module)]),
        None => redis_server::RedisServer::start(),
    };
    if let Ok(cpus) = std::env::var("BENCH_REDIS_CPUS") {
        pin(redis.port, &cpus);
    }
    let store = RedisStore::connect(&redis.url(), Duration::from_secs(5))
        .await
        .expect("the private redis-server");
    println!(
        "# redis_cost{}: private redis-server on 127.0.0.1:{} ({})",
        if quick { " --quick" } else { "" },
        redis.port,
        cli(redis.port, &["INFO", "server"])
            .lines()
            .find(|l| l.starts_with("redis_version:"))
            .unwrap_or("redis_version:?")
            .trim()
    );
    let rounds = env_u64("BENCH_ROUNDS", 1);
    let before = std::env::var("BENCH_BEFORE_LUA")
        .ok()
        .map(|dir| load_before(redis.port, &dir));
    let limiter = &store.library().limiter;
    let before = before.as_deref();
    if std::env::var("BENCH_ONLY").as_deref() == Ok("coalesced") {
        // Part 2 twice: the general function, then the generated shapes
        // (each store reads the switch when it connects).
        for (name, switch) in [("general function", "off"), ("generated shapes", "on")] {
            std::env::set_var("THROTTLE_LIMITER_SHAPES", switch);
            let store = RedisStore::connect(&redis.url(), Duration::from_secs(5))
                .await
                .expect("the private redis-server");
            println!("\n# part 2 through the {name} (THROTTLE_LIMITER_SHAPES={switch})");
            cli(redis.port, &["FLUSHALL"]);
            let limiter = never_refusing(&store);
            coalescing(redis.port, &limiter, callers, secs, cell.is_some()).await;
        }
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("jobs") {
        jobs_cost(redis.port, limiter, before, requests, rounds);
        return;
    }
    jobs_cost(redis.port, limiter, before, requests, rounds);
    let ours_gcra = script_cost(redis.port, limiter, before, requests, rounds, false);
    script_cost(redis.port, limiter, before, requests, rounds, true);
    prototypes(redis.port, &store.library().limiter, requests);
    if cell.is_some() {
        cell_cost(redis.port, requests, ours_gcra);
    }
    cli(redis.port, &["FLUSHALL"]);
    let limiter = never_refusing(&store);
    coalescing(redis.port, &limiter, callers, secs, cell.is_some()).await;
    cli(redis.port, &["FLUSHALL"]);
    let rates: &[u64] = if quick {
        &[5_000]
    } else {
        &[1_000, 5_000, 20_000]
    };
    latency(&limiter, rates, secs).await;
}
