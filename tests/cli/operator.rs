//! The operator commands' output, as the book promises it (issues 8 and
//! 12): `check-config` prints the resolved rules per tier and named seller
//! (table and JSON) and exits non-zero naming file, key and problem;
//! `limits peek` answers without charging.


use std::path::Path;
use std::process::Command;

use crate::common::cli::{run, stdout_of};

fn config(dir: &Path, prefix: &str, limits: &str) -> std::path::PathBuf {
    let path = dir.join("operator.toml");
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\n{limits}",
            crate::common::redis_url()
        ),
    )
    .unwrap();
    path
}

const LIMITS: &str = r#"[limits]
default = [{ algorithm = "fixed_window", limit = 3, period = "1m" },
           { algorithm = "gcra", limit = 1, period = "1m", shadow = true }]
global = [{ algorithm = "gcra", limit = 1000, period = "1s" }]
[limits.tiers]
bulk = [{ algorithm = "token_bucket", limit = 600, period = "1m", burst = 50 }]
[limits.sellers]
"big" = { tier = "bulk" }
"own" = { rules = [{ algorithm = "sliding_window_log", limit = 10, period = "1s" }] }
"free" = { unlimited = true }
"#;

#[test]
fn check_config_prints_every_tier_and_named_seller() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "opcli", LIMITS);

    let table = stdout_of(&run(&["check-config"], &path));
    assert!(table.starts_with("configuration is valid\n"), "{table}");
    // The table's cells, columns split where two or more spaces part them.
    let rows: Vec<Vec<String>> = table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect();
    for row in [
        &[
            "(default)",
            "default",
            "fixed_window 3 per 1m",
            "gcra 1 per 1m",
        ][..],
        &["(tier bulk)", "bulk", "token_bucket 600 per 1m (burst 50)"],
        &["big", "bulk", "token_bucket 600 per 1m (burst 50)"],
        &["free", "unlimited", "unlimited"],
        &["own", "seller", "sliding_window_log 10 per 1s"],
    ] {
        assert!(
            rows.iter().any(|r| r == row),
            "missing row {row:?} in:\n{table}"
        );
    }

    let json: serde_json::Value =
        serde_json::from_str(&stdout_of(&run(&["check-config", "--json"], &path))).unwrap();
    assert_eq!(json["valid"], true);
    assert_eq!(json["default"]["rules"][0], "fixed_window 3 per 1m");
    assert_eq!(json["default"]["shadow"][0], "gcra 1 per 1m");
    assert_eq!(json["global"]["rules"][0], "gcra 1000 per 1s");
    assert_eq!(
        json["tiers"]["bulk"]["rules"][0],
        "token_bucket 600 per 1m (burst 50)"
    );
    let sellers = json["sellers"].as_array().unwrap();
    let tier_of = |s: &str| {
        sellers
            .iter()
            .find(|x| x["seller"] == s)
            .map(|x| x["tier"].as_str().unwrap().to_owned())
    };
    assert_eq!(tier_of("big").as_deref(), Some("bulk"));
    assert_eq!(tier_of("own").as_deref(), Some("seller"));
    assert_eq!(tier_of("free").as_deref(), Some("unlimited"));
}

#[test]
fn check_config_names_file_key_and_problem_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        dir.path(),
        "opcli",
        "[limits.sellers]\n\"s\" = { tier = \"missing\" }\n",
    );
    let out = run(&["check-config"], &path);
    assert_eq!(out.status.code(), Some(3), "an invalid config: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("operator.toml")
            && err.contains("limits.sellers.s.tier")
            && err.contains("unknown tier \"missing\""),
        "{err}"
    );
}

#[tokio::test]
async fn peek_answers_without_charging() {
    let prefix = crate::common::unique_prefix("opcli-peek");
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &prefix, LIMITS);
    let peek = |cost: &str| {
        let out = run(&["limits", "peek", "s", "--cost", cost, "--json"], &path);
        serde_json::from_str::<serde_json::Value>(&stdout_of(&out)).unwrap()
    };
    // Three peeks of 3 under a limit of 3 a minute: each granted, as nothing
    // was charged by the one before.
    for _ in 0..3 {
        let p = peek("3");
        assert_eq!(p["result"], "granted", "{p}");
        assert_eq!(p["granted"], 3);
    }
    let p = peek("4");
    assert_eq!(p["result"], "never", "{p}");
    assert!(p["reason"].as_str().unwrap().contains("capacity 3"), "{p}");
    // And the seller's state is untouched: all 3 remain.
    let shown: serde_json::Value =
        serde_json::from_str(&stdout_of(&run(&["limits", "show", "s", "--json"], &path))).unwrap();
    assert_eq!(shown["rules"][0]["remaining"], 3, "{shown}");
}

/// Regression: `limits show` listed the global shadow rules for an
/// `unlimited` seller, although shadow rules skip such sellers (nothing
/// is counted for it). A limited seller still shows them.
#[tokio::test]
async fn show_lists_no_shadow_rule_for_an_unlimited_seller() {
    let prefix = crate::common::unique_prefix("opcli-unlimited");
    let dir = tempfile::tempdir().unwrap();
    let limits = r#"[limits]
default = [{ algorithm = "fixed_window", limit = 3, period = "1m" }]
global = [{ algorithm = "gcra", limit = 1000, period = "1s" },
          { algorithm = "fixed_window", limit = 50, period = "1m", shadow = true }]
[limits.sellers]
"free" = { unlimited = true }
"#;
    let path = config(dir.path(), &prefix, limits);
    let show = |seller: &str| {
        let out = run(&["limits", "show", seller, "--json"], &path);
        serde_json::from_str::<serde_json::Value>(&stdout_of(&out)).unwrap()
    };
    let kinds = |shown: &serde_json::Value| -> Vec<String> {
        shown["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    let free = show("free");
    assert_eq!(free["unlimited"], true, "{free}");
    assert!(kinds(&free).is_empty(), "{free}");
    let table = stdout_of(&run(&["limits", "show", "free"], &path));
    assert!(table.contains("no rules"), "{table}");
    assert!(!table.contains("global_shadow"), "{table}");

    let limited = show("s");
    assert_eq!(
        kinds(&limited),
        ["seller", "global", "global_shadow"],
        "{limited}"
    );
}

/// `limiter-demo`: for every algorithm, 8 requests at once under "5 per
/// second, burst 5": the first five granted, then refusals with a
/// retry-after of at most two periods, then one more request at that retry-after,
/// granted; and the bytes the seller's state takes in Redis.
#[test]
fn limiter_demo_shows_every_algorithm_grant_refuse_and_retry() {
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .args(["limiter-demo", "--redis-url", &crate::common::redis_url()])
        .output()
        .expect("run throttle-worker");
    let text = stdout_of(&out);
    let lines: Vec<&str> = text.lines().collect();
    for algorithm in throttle_worker::limiter::Algorithm::ALL {
        let name = algorithm.name();
        let at = lines
            .iter()
            .position(|l| *l == name)
            .unwrap_or_else(|| panic!("no section for {name}:\n{text}"));
        let section: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .copied()
            .collect();
        for i in 1..=5 {
            let line = section
                .iter()
                .find(|l| l.starts_with(&format!("  #{i} ")))
                .unwrap_or_else(|| panic!("{name}: no request #{i}: {section:?}"));
            assert!(
                line.contains("granted"),
                "{name}: #{i} within the burst: {line}"
            );
        }
        let denied: Vec<u64> = section
            .iter()
            .filter(|l| l.starts_with("  #") && l.contains("denied, retry after "))
            .map(|l| {
                l.split("retry after ")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(
            !denied.is_empty(),
            "{name}: nothing refused past the burst: {section:?}"
        );
        // Within two periods: sliding_window_counter weighs the previous
        // window in, so its wait may reach into the window after next.
        assert!(
            denied.iter().all(|ms| (1..=2000).contains(ms)),
            "{name}: retry-afters {denied:?} ms, want within two periods"
        );
        let retry = section
            .iter()
            .find(|l| l.starts_with("  after "))
            .unwrap_or_else(|| panic!("{name}: no retry at the retry-after: {section:?}"));
        assert!(
            retry.contains(": granted"),
            "{name}: a retry at the retry-after passes: {retry}"
        );
        let bytes: u64 = section
            .iter()
            .find_map(|l| l.strip_prefix("  state: "))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no state size: {section:?}"));
        assert!(
            (64..=1024).contains(&bytes),
            "{name}: {bytes} bytes of state for one seller"
        );
    }
}

/// `limits show` tells a capped seller's slots of `max_in_flight` held
/// across the fleet (issue 22, part 3); an uncapped seller has none.
#[tokio::test]
async fn show_tells_the_slots_a_capped_seller_holds() {
    let prefix = crate::common::unique_prefix("opcli-inflight");
    let dir = tempfile::tempdir().unwrap();
    let limits = r#"[limits]
default = [{ algorithm = "fixed_window", limit = 100, period = "1m" }]
[limits.sellers]
"capped" = { max_in_flight = 2 }
"#;
    let path = config(dir.path(), &prefix, limits);
    // A replica's grant: one job, one slot (on Redis' clock, a 30 s lease).
    let loaded = throttle_worker::config::load_from(Some(&path), Vec::new()).unwrap();
    let policy = throttle_worker::limiter::Policy::load(&loaded).unwrap();
    let lim = crate::common::limiter(&prefix, policy).await;
    let g = lim.acquire_jobs("capped", &[1]).await.unwrap();
    assert_eq!(g.jobs(), 1, "{g:?}");
    let show = |seller: &str| {
        let out = run(&["limits", "show", seller, "--json"], &path);
        serde_json::from_str::<serde_json::Value>(&stdout_of(&out)).unwrap()
    };
    let shown = show("capped");
    assert_eq!(shown["in_flight"]["held"], 1, "{shown}");
    assert_eq!(shown["in_flight"]["max_in_flight"], 2, "{shown}");
    assert!(show("other")["in_flight"].is_null());
    let table = stdout_of(&run(&["limits", "show", "capped"], &path));
    assert!(
        table.contains("calls in flight: 1 of max_in_flight 2"),
        "{table}"
    );
}

/// A config of its own key prefix whose seller `s` has spent 2 of its 3 a
/// minute (the directory holding the config lives as long as the first).
async fn seller_charged_two(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    use throttle_worker::limiter::{Mode, Request};
    let prefix = crate::common::unique_prefix(name);
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &prefix, LIMITS);
    let limiter = throttle_worker::operator::open_limiter(Some(&path))
        .await
        .unwrap();
    limiter
        .check(Request::new("s", 2, Mode::AllOrNothing))
        .await
        .unwrap();
    (dir, path)
}

/// What `limits show` says seller `s` has left of its first rule.
fn remaining_of(path: &Path) -> u64 {
    let shown = stdout_of(&run(&["limits", "show", "s", "--json"], path));
    let v: serde_json::Value = serde_json::from_str(&shown).unwrap();
    v["rules"][0]["remaining"].as_u64().unwrap()
}

/// Issue 35: `limits reset` acts on every replica at once. Off a terminal
/// (the test's stdin is closed) it needs --yes: without it, exit 4 and the
/// seller's state stays; --dry-run lists the keys and changes nothing;
/// with --yes the state is gone.
#[tokio::test]
async fn reset_off_a_terminal_needs_yes_and_a_dry_run_changes_nothing() {
    let (_dir, path) = seller_charged_two("opcli-reset").await;
    let remaining = || remaining_of(&path);
    assert_eq!(remaining(), 1);

    let out = run(&["limits", "reset", "s"], &path);
    assert_eq!(out.status.code(), Some(4), "declined: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--yes"), "the refusal names the flag: {err}");
    assert_eq!(remaining(), 1, "a declined reset changes nothing");

    let plan = stdout_of(&run(&["limits", "reset", "s", "--dry-run", "--json"], &path));
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(plan["dry_run"], true, "{plan}");
    assert!(
        !plan["held_state"].as_array().unwrap().is_empty(),
        "the seller's state is listed: {plan}"
    );
    let table = stdout_of(&run(&["limits", "reset", "s", "--dry-run"], &path));
    assert!(table.contains("holds state"), "{table}");
    assert_eq!(remaining(), 1, "a dry run changes nothing");

    stdout_of(&run(&["limits", "reset", "s", "--yes"], &path));
    assert_eq!(remaining(), 3, "with --yes the state is cleared");
}

/// On a terminal `limits reset` asks: "n" (or anything but y) changes
/// nothing and exits 4, "y" clears the state. The terminal is a real
/// pseudo-terminal, from util-linux's `script`, which types the answer.
#[tokio::test]
async fn reset_on_a_terminal_asks_and_acts_only_on_yes() {
    let (_dir, path) = seller_charged_two("opcli-tty").await;
    let remaining = || remaining_of(&path);
    let on_a_terminal = |answer: &str| {
        use std::io::Write;
        let line = format!(
            "{} limits reset s --config {}",
            env!("CARGO_BIN_EXE_throttle-worker"),
            path.display()
        );
        let mut child = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("util-linux's script");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = on_a_terminal("n\n");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("Proceed? [y/N]"), "the question: {shown}");
    assert_eq!(out.status.code(), Some(4), "declined: {out:?}");
    assert_eq!(remaining(), 1, "a no changes nothing");
    let out = on_a_terminal("y\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(remaining(), 3, "a yes clears the state");
}

/// `limits pause --all` stops the whole fleet: off a terminal it needs
/// --yes (exit 4 without, no pause written); --dry-run prints the pause
/// and writes nothing; a seller's own pause needs no confirmation.
#[tokio::test]
async fn pause_all_off_a_terminal_needs_yes_and_a_dry_run_writes_nothing() {
    let prefix = crate::common::unique_prefix("opcli-pause");
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &prefix, LIMITS);
    let paused = || {
        let shown = stdout_of(&run(&["limits", "show", "s", "--json"], &path));
        let v: serde_json::Value = serde_json::from_str(&shown).unwrap();
        !v["paused"].is_null()
    };

    let out = run(&["limits", "pause", "--all", "--for", "5m"], &path);
    assert_eq!(out.status.code(), Some(4), "declined: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--yes"));
    assert!(!paused(), "a declined pause writes nothing");

    let said = stdout_of(&run(&["limits", "pause", "--all", "--for", "5m", "--dry-run"], &path));
    assert!(said.starts_with("dry run: would pause every seller"), "{said}");
    assert!(!paused(), "a dry run writes nothing");

    stdout_of(&run(&["limits", "pause", "--all", "--for", "5m", "--yes"], &path));
    assert!(paused(), "with --yes every seller is paused");
    stdout_of(&run(&["limits", "resume", "--all"], &path));
    assert!(!paused());

    stdout_of(&run(&["limits", "pause", "s", "--for", "5m"], &path));
    assert!(paused(), "one seller's pause is not fleet-wide");
    stdout_of(&run(&["limits", "resume", "s"], &path));
}

/// Exit 3 for a config that does not load, from every command that loads
/// one, before any question is asked.
#[test]
fn an_invalid_config_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "opcli", "[worker]\nmax_payload_bytes = \"12 parsecs\"\n");
    for args in [
        &["check-config"][..],
        &["limits", "show", "s"],
        &["limits", "reset", "s"],
        &["limits", "pause", "--all"],
    ] {
        let out = run(args, &path);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("operator.toml")
                && err.contains("worker.max_payload_bytes")
                && err.contains("unknown unit \"parsecs\""),
            "{args:?}: {err}"
        );
    }
}

/// Issue 35: a config written with a key's old name still loads;
/// `check-config` says which file used which old name and what replaced it
/// (as a table's first lines and in the JSON), and exits 0.
#[test]
fn check_config_prints_the_old_key_names_a_config_uses() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        dir.path(),
        "opcli",
        "[downstream]\noutage_after = 3\nbackoff_max = \"10s\"\n",
    );
    let table = stdout_of(&run(&["check-config"], &path));
    let shown = path.display().to_string();
    assert!(
        table.starts_with(&format!(
            "warning: {shown}: downstream.backoff_max is deprecated and will be removed; rename it to downstream.max_backoff\n"
        )),
        "{table}"
    );
    assert!(
        table.contains("downstream.outage_after is deprecated and will be removed; rename it to downstream.outage_after_failures"),
        "{table}"
    );
    assert!(table.contains("configuration is valid\n"), "{table}");

    let json: serde_json::Value =
        serde_json::from_str(&stdout_of(&run(&["check-config", "--json"], &path))).unwrap();
    let old: Vec<&str> = json["deprecations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["old"].as_str().unwrap())
        .collect();
    assert_eq!(old, ["downstream.backoff_max", "downstream.outage_after"], "{json}");

    // Both names at once: refused, naming both (exit 3).
    let both = config(
        dir.path(),
        "opcli",
        "[downstream]\noutage_after = 3\noutage_after_failures = 4\n",
    );
    let out = run(&["check-config"], &both);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("downstream.outage_after ") && err.contains("downstream.outage_after_failures"),
        "{err}"
    );
}

/// A flag's value out of its range is a usage error, like any bad flag.
#[test]
fn a_value_out_of_range_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "opcli", "");
    for args in [
        &["dlq", "replay", "--rate", "0"][..],
        &["dlq", "replay", "--in-flight", "0"],
        &["limits", "pause", "--all", "--nonsense"],
    ] {
        let out = run(args, &path);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

/// `run` logs each old key name its config uses once, at startup, before
/// anything else can fail (here Redis, which nothing answers for: exit 1,
/// a run-time failure).
#[test]
fn run_warns_once_of_each_old_key_name_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(
        &path,
        format!(
            "[downstream]\noutage_after = 3\n\n[redis]\nurl = \"redis://127.0.0.1:{}\"\n",
            crate::common::free_port()
        ),
    )
    .unwrap();
    let out = run(&["run"], &path);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let logs = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let warning = "downstream.outage_after is deprecated and will be removed; rename it to downstream.outage_after_failures";
    assert_eq!(logs.matches(warning).count(), 1, "{logs}");
}

/// The exit codes are listed at the end of the top-level `--help` (and so
/// in the man page), from the one list in the library.
#[test]
fn the_top_level_help_lists_every_exit_code() {
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .arg("--help")
        .output()
        .expect("run throttle-worker");
    let help = stdout_of(&out);
    for code in throttle_worker::operator::ExitCode::ALL {
        let line = format!("  {}  {}", code.code(), code.description());
        assert!(help.contains(&line), "{line:?} missing from:\n{help}");
    }
}
