//! End to end against named earlier builds (issue 49): a ratio inside one
//! build (limiter on / off, as `end_to_end` prints) cannot see a change
//! that slows both halves, so this bench builds the commits it is given,
//! each into a target directory of its own, and runs their binaries beside
//! the head's, black-box, on the same machine in the same run.
//!
//! Each run: fresh topics on an in-process mock broker (8 partitions), the
//! jobs produced before the worker starts (JOBS over 1,000 sellers, keyed
//! at random as producers keyed by job do), a fresh key prefix in a private
//! `redis-server`, the in-process downstream that answers at once, and one
//! worker process (`throttle-worker run --config FILE`). Limiter off: every
//! seller `unlimited`; on: a default GCRA rule of 1,000,000 a second, which
//! never refuses. Jobs/s is taken between the first and the last downstream
//! arrival; limiter calls per job are Redis' own FCALL/EVALSHA count
//! (`INFO commandstats`). The builds run by turns within each round, so
//! that a noisy minute hurts them alike.
//!
//!     cargo bench --bench baseline -- 685ee49 3f8c1ee          # 20,000 jobs, 3 rounds
//!     cargo bench --bench baseline -- --quick --rounds 2 3f8c1ee
//!
//! `--baseline REV` names a commit too. With `--perf DIR`, each worker
//! process runs under `perf record -F 999 --call-graph dwarf` (from its
//! start to the last job's arrival, when it is killed) into
//! `DIR/BUILD-on|off-rROUND.data`; perf slows the worker, so read that
//! run's profiles, not its jobs/s. `scripts/perf-shares.py` reads them
//! (BENCHMARKS.md, "Per-job costs since 1b610e5"):
//!
//!     cargo bench --bench baseline -- --perf /tmp/tw-perf 685ee49
//!     scripts/perf-shares.py --jobs 20000 /tmp/tw-perf/head-on-r*.data
//!
//! A commit's binary is built once, with the `bench` profile the head's is
//! built with, from `git archive REV` into `target/baseline/REV/src`, its
//! target directory `target/baseline/REV` (the first build takes minutes on
//! two cores: cargo's progress is shown).

#[path = "../tests/common/mod.rs"]
mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::{Proc, BIN};
use common::redis_server::{limiter_calls, RedisServer};
use common::worker::{always_ok, job, Bench, Downstream};

const SELLERS: usize = 1_000;
const PARTITIONS: i32 = 8;

/// The crate's root (this bench's manifest directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `rev`'s binary, built into `target/baseline/REV/` unless already there.
fn build(rev: &str) -> PathBuf {
    let dir = root().join("target/baseline").join(rev);
    // The bench profile builds into `release/`.
    let bin = dir.join("release/throttle-worker");
    if bin.exists() {
        eprintln!("{rev}: binary already built at {}", bin.display());
        return bin;
    }
    let src = dir.join("src");
    std::fs::create_dir_all(&src).expect("baseline source directory");
    eprintln!(
        "{rev}: exporting the tree (git archive) to {}",
        src.display()
    );
    let mut archive = Command::new("git")
        .args(["archive", "--format=tar", rev])
        .current_dir(root())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git archive");
    let status = Command::new("tar")
        .args(["-x", "-C"])
        .arg(&src)
        .stdin(archive.stdout.take().expect("git archive's output"))
        .status()
        .expect("tar");
    let archived = archive.wait().expect("git archive's exit");
    assert!(
        archived.success(),
        "{rev}: git archive failed (is it a commit?)"
    );
    assert!(status.success(), "{rev}: could not export the tree");
    eprintln!("{rev}: cargo build --profile bench --bin throttle-worker (minutes on two cores)");
    let status = Command::new("cargo")
        .args(["build", "--profile", "bench", "--bin", "throttle-worker"])
        .arg("--target-dir")
        .arg(&dir)
        .current_dir(&src)
        .status()
        .expect("cargo build");
    assert!(status.success(), "{rev}: the build failed");
    bin
}

/// A config both old and new builds read: the keys of 685ee49 and later.
fn config(bench: &Bench, redis: &RedisServer, limited: bool) -> String {
    let mut text = format!(
        r#"[kafka]
brokers = "{brokers}"
group_id = "{group}"
topic = "{jobs}"
retry_topic_prefix = "{retry}"
dlq_topic = "{dlq}"
commit_interval = "200ms"

[kafka.consumer_properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "300"

[redis]
url = "{redis}"
key_prefix = "{prefix}"
on_state_loss = "admit"

[downstream]
timeout = "5s"

[http]
listen = "127.0.0.1:0"

[limits]
default = [{{ algorithm = "gcra", limit = 1000000, period = "1s" }}]
"#,
        brokers = bench.bootstrap(),
        group = bench.group,
        jobs = bench.topics.jobs,
        retry = bench.topics.retry,
        dlq = bench.topics.dlq,
        redis = redis.url(),
        prefix = bench.prefix,
    );
    if !limited {
        for i in 0..SELLERS {
            text.push_str(&format!(
                "\n[limits.sellers.\"seller-{i}\"]\nunlimited = true\n"
            ));
        }
    }
    text
}

struct Outcome {
    jobs_per_s: f64,
    calls_per_job: f64,
}

/// The worker's command line, under `perf record` when `perf` names its
/// output (perf starts it, so every thread is sampled from the first).
fn worker_command(bin: &Path, perf: Option<&Path>) -> Command {
    let Some(out) = perf else {
        return Command::new(bin);
    };
    let mut cmd = Command::new("perf");
    cmd.args([
        "record",
        "-q",
        "-F",
        "999",
        "--call-graph",
        "dwarf,16384",
        "-o",
    ])
    .arg(out)
    .arg("--")
    .arg(bin);
    cmd
}

/// Ends a profiled run: SIGKILL to the worker (perf's child, as without
/// perf at the end of a run), after which perf writes its file and exits
/// by the worker's signal.
async fn stop_perf(perf: &mut Proc) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children", pid = perf.pid()))
            .expect("perf record's children");
    for child in children.split_whitespace() {
        let _ = Command::new("kill").args(["-KILL", child]).status();
    }
    let status = perf
        .wait_exit("perf record", Duration::from_secs(120))
        .await;
    assert!(
        status.success() || status.signal() == Some(9),
        "perf record failed ({status}; log: {})",
        perf.log.display()
    );
}

async fn one_run(
    bin: &Path,
    redis: &RedisServer,
    jobs: usize,
    limited: bool,
    perf: Option<&Path>,
) -> Outcome {
    let bench = Bench::new("baseline", PARTITIONS);
    let downstream = Downstream::start(always_ok()).await;
    let records: Vec<_> = (0..jobs)
        .map(|i| job(&format!("j{i}"), &format!("seller-{}", i % SELLERS)))
        .collect();
    bench.produce(&records).await;
    let dir = std::env::temp_dir().join(format!("tw-baseline-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).expect("run directory");
    let file = dir.join("worker.toml");
    std::fs::write(&file, config(&bench, redis, limited)).expect("config file");
    Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "CONFIG", "RESETSTAT"])
        .output()
        .expect("redis-cli");
    let mut cmd = worker_command(bin, perf);
    cmd.arg("run")
        .arg("--config")
        .arg(&file)
        .env("RUST_LOG", "warn")
        .env("THROTTLE__DOWNSTREAM__URL", &downstream.url);
    let mut worker = Proc::spawn("worker", cmd, &dir, false);
    let started = Instant::now();
    while downstream.count() < jobs {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{}: only {} of {jobs} jobs reached the downstream in 300 s (log: {})",
            bin.display(),
            downstream.count(),
            worker.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arrivals = downstream.arrivals();
    let first = arrivals.iter().map(|a| a.at).min().expect("arrivals");
    let last = arrivals.iter().map(|a| a.at).max().expect("arrivals");
    let calls = limiter_calls(redis.port);
    if perf.is_some() {
        stop_perf(&mut worker).await;
    }
    drop(worker);
    let _ = std::fs::remove_dir_all(&dir);
    Outcome {
        jobs_per_s: jobs as f64 / (last - first).as_secs_f64().max(1e-6),
        calls_per_job: calls as f64 / jobs as f64,
    }
}

/// The commit the head's binary was built from, and whether `src/`, `lua/`
/// or `Cargo.lock` had changes not committed (the head is the work tree).
fn head_state() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let rev = git(&["rev-parse", "--short", "HEAD"]);
    if git(&["status", "--porcelain", "--", "src", "lua", "Cargo.lock"]).is_empty() {
        rev
    } else {
        format!("{rev} with uncommitted changes in src/, lua/ or Cargo.lock")
    }
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .map_or(3, |n| n.parse().expect("--rounds N"));
    let perf_dir: Option<PathBuf> = args
        .iter()
        .position(|a| a == "--perf")
        .map(|i| PathBuf::from(args.get(i + 1).expect("--perf DIR")));
    if let Some(dir) = &perf_dir {
        std::fs::create_dir_all(dir).expect("--perf DIR");
    }
    // Every other word is a commit (`--baseline` before one is a flag here).
    let revs: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| {
            !a.starts_with("--")
                && (*i == 0 || !["--rounds", "--perf"].contains(&args[i - 1].as_str()))
                && *a != "--bench"
        })
        .map(|(_, a)| a)
        .collect();
    assert!(
        !revs.is_empty(),
        "name at least one commit to compare with: cargo bench --bench baseline -- 685ee49"
    );
    let jobs = if quick { 10_000 } else { 20_000 };
    let mut builds: Vec<(String, PathBuf)> =
        revs.iter().map(|r| (r.to_string(), build(r))).collect();
    builds.push(("head".to_owned(), PathBuf::from(BIN)));
    let redis = RedisServer::start();
    println!("# head: {}", head_state());
    println!("# baseline: one replica per run, mock broker ({PARTITIONS} partitions), private redis-server, local downstream; {jobs} jobs over {SELLERS} sellers; {rounds} rounds\n");
    // [build][limited] -> jobs/s per round, calls per job per round.
    let mut rates = vec![[Vec::new(), Vec::new()]; builds.len()];
    let mut calls = vec![[Vec::new(), Vec::new()]; builds.len()];
    for round in 1..=rounds {
        for limited in [false, true] {
            for (b, (name, bin)) in builds.iter().enumerate() {
                let out = perf_dir.as_ref().map(|d| {
                    let limiter = if limited { "on" } else { "off" };
                    d.join(format!("{name}-{limiter}-r{round}.data"))
                });
                let r = one_run(bin, &redis, jobs, limited, out.as_deref()).await;
                eprintln!(
                    "round {round}: {name}, limiter {}: {:.0} jobs/s, {:.3} limiter calls per job",
                    if limited { "on" } else { "off" },
                    r.jobs_per_s,
                    r.calls_per_job
                );
                rates[b][usize::from(limited)].push(r.jobs_per_s);
                calls[b][usize::from(limited)].push(r.calls_per_job);
            }
        }
    }
    let head = builds.len() - 1;
    let med = |v: &[f64]| median(&mut v.to_vec());
    println!("| build | limiter | jobs/s by round | median | head / build | limiter calls per job | on / off |");
    println!("|---|---|---|---:|---:|---:|---:|");
    for (b, (name, _)) in builds.iter().enumerate() {
        for limited in [false, true] {
            let l = usize::from(limited);
            let rounds: Vec<String> = rates[b][l].iter().map(|r| format!("{r:.0}")).collect();
            let m = med(&rates[b][l]);
            println!(
                "| {name} | {} | {} | {m:.0} | {:.2} | {:.3} | {} |",
                if limited { "on" } else { "off" },
                rounds.join(" / "),
                med(&rates[head][l]) / m,
                med(&calls[b][l]),
                if limited {
                    format!("{:.2}", m / med(&rates[b][0]))
                } else {
                    String::new()
                }
            );
        }
    }
}
