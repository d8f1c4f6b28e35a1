//! `throttle-worker demo` through the binary, as the book runs it (docs/src/start/demo.md): a
//! short run passes its own checks and leaves no replica behind; a run
//! whose stub miscounts on purpose fails them, naming the cause.
//!
//! Needs Redis at `REDIS_URL` (default redis://127.0.0.1:6379); the demo
//! brings its own broker, stub and replicas.


use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_throttle-worker");

/// A short demo: 12 s live (8 s of load), two replicas, four sellers (one
/// of each throttled role), 80 jobs/s.
const SHORT: [&str; 8] = [
    "--duration",
    "12s",
    "--replicas",
    "2",
    "--sellers",
    "4",
    "--rate",
    "80",
];

/// Runs the demo with `extra` flags; kills it after 90 s (it ends by
/// itself in ~25 s).
fn demo(extra: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .arg("demo")
        .args(SHORT)
        .args(extra)
        .arg("--redis-url")
        .arg(crate::common::redis_url())
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the demo");
    // Drain the pipes on threads, so a chatty child never blocks on them.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut s).unwrap();
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut s).unwrap();
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo did not end within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    };
    (output, started.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Processes whose command line mentions `dir` (the demo's replicas run
/// `--config dir/replica-N.toml`).
fn processes_under(dir: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = entry.path().join("cmdline");
        if let Ok(bytes) = std::fs::read(&cmdline) {
            let line = String::from_utf8_lossy(&bytes).replace('\0', " ");
            if line.contains(dir) {
                found.push(format!("{}: {line}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn a_short_demo_holds_every_limit_loses_nothing_and_leaves_no_replica() {
    let (out, took) = demo(&["--keep-logs"]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    eprintln!("demo took {took:.1?}");
    assert!(
        out.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("4 of 4 sellers within their limits"),
        "{stdout}"
    );
    for seller in ["seller-0", "seller-1", "seller-2", "seller-3"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{seller} ")) && l.contains(" in "))
            .unwrap_or_else(|| panic!("no summary line for {seller}:\n{stdout}"));
        assert!(line.ends_with("within"), "{seller}: {line}");
    }
    // 640 jobs: every one done or dead-lettered.
    let lost = stdout
        .lines()
        .find(|l| l.starts_with("Nothing lost: "))
        .unwrap_or_else(|| panic!("no accounting line:\n{stdout}"));
    assert!(lost.starts_with("Nothing lost: 640 produced = "), "{lost}");
    assert!(lost.contains(" + 0 missing;"), "{lost}");
    assert!(stdout.contains("All checks hold"), "{stdout}");

    // The replicas are gone with the demo.
    let kept = stdout
        .lines()
        .find_map(|l| l.strip_prefix("replica logs and configs kept in "))
        .unwrap_or_else(|| panic!("--keep-logs names the directory:\n{stdout}"))
        .trim()
        .to_owned();
    assert!(Path::new(&kept).join("replica-2.log").exists(), "{kept}");
    let left = processes_under(&kept);
    assert!(left.is_empty(), "replicas outlived the demo: {left:?}");
    let _ = std::fs::remove_dir_all(&kept);
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

#[test]
fn a_stub_that_miscounts_makes_the_demo_fail_with_the_cause() {
    // seller-1 is held to its limit: counted twice, it is over. seller-3's
    // calls are answered and forgotten: its jobs are missing.
    let (out, _) = demo(&[
        "--fault-double-count",
        "seller-1",
        "--fault-forget",
        "seller-3",
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(5),
        "the checks must fail, with the code of a failed check:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("the demo's checks failed"),
        "the error names the checks:\n{stderr}"
    );
    let over = stderr
        .lines()
        .find(|l| l.contains("seller-1 went over its limit (sliding_window_log "))
        .unwrap_or_else(|| panic!("no limit failure for seller-1:\n{stderr}"));
    assert!(over.contains(" at the stub, its rule allows "), "{over}");
    assert!(
        stderr.contains("jobs are missing (neither accepted by the stub nor dead-lettered)"),
        "{stderr}"
    );
    // The other sellers were counted honestly and held.
    assert!(
        stdout.contains("3 of 4 sellers within their limits"),
        "{stdout}"
    );
    assert!(stdout.contains("check(s) FAILED"), "{stdout}");
}
