//! Temporary overrides (issue 8): `limits override` gives a seller a rule
//! of its own until an expiry, through Redis, so every replica applies it on
//! its next refresh; `limits list` and `limits show` list it; it is gone at
//! its expiry or with `--clear`, and the configured limits apply again.

use std::process::Command;
use std::time::Duration;

use crate::common::{rule, unique_prefix};
use throttle_worker::limiter::{Decision, Mode};

fn cli(config: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .arg("limits")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run throttle-worker");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn grants<S: throttle_worker::limiter::Store>(
    limiter: &throttle_worker::limiter::Limiter<S>,
    seller: &str,
) -> usize {
    let mut n = 0;
    while n < 50 {
        match limiter
            .acquire(seller, 1, Mode::AllOrNothing)
            .await
            .unwrap()
        {
            Decision::Granted(_) => n += 1,
            _ => break,
        }
    }
    n
}

#[tokio::test]
async fn an_override_applies_until_it_expires_or_is_cleared() {
    let prefix = unique_prefix("override");
    let limiter = crate::common::limiter(
        &prefix,
        crate::common::policy(vec![rule("fixed_window", 2, "1m", None)], vec![]),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    // The limiter above keeps state v1 (`KeySpace::new`): the commands run
    // the layout the config names.
    let config = dir.path().join("limits.toml");
    std::fs::write(
        &config,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\n[limits]\ndefault = [{{ algorithm = \"fixed_window\", limit = 2, period = \"1m\" }}]\n",
            crate::common::redis_url()
        ),
    )
    .unwrap();

    let set = cli(
        &config,
        &[
            "override",
            "vip",
            "--rule",
            "fixed_window:6/1m",
            "--for",
            "3s",
        ],
    );
    assert!(
        set.starts_with("vip: fixed_window 6 per 1m until "),
        "{set}"
    );
    let listed = cli(&config, &["list"]);
    assert!(
        listed
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("vip") && l.contains("fixed_window 6 per 1m")),
        "{listed}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&cli(&config, &["list", "--json"])).unwrap();
    assert_eq!(listed[0]["seller"], "vip");
    assert_eq!(listed[0]["rule"]["limit"], 6);
    let shown: serde_json::Value =
        serde_json::from_str(&cli(&config, &["show", "vip", "--json"])).unwrap();
    assert_eq!(shown["tier"], "override", "{shown}");
    assert_eq!(shown["override"]["rule"]["algorithm"], "fixed_window");
    assert_eq!(shown["rules"][0]["remaining"], 6, "{shown}");
    assert_eq!(limiter.refresh_overrides().await.unwrap(), 1);
    assert_eq!(grants(&limiter, "vip").await, 6, "the override's limit");
    // Used up: `limits show` tells how long until it admits again, and
    // charges nothing itself.
    let shown: serde_json::Value =
        serde_json::from_str(&cli(&config, &["show", "vip", "--json"])).unwrap();
    assert_eq!(shown["rules"][0]["remaining"], 0, "{shown}");
    let retry = shown["rules"][0]["retry_after_seconds"].as_f64().unwrap();
    assert!(retry > 0.0 && retry <= 60.0, "{shown}");
    let table = cli(&config, &["show", "vip"]);
    assert!(
        table.starts_with("seller vip: tier override (override until "),
        "{table}"
    );
    assert!(
        table.contains("fixed_window 6 per 1m  seller  0"),
        "{table}"
    );
    assert_eq!(
        grants(&limiter, "plain").await,
        2,
        "others keep the config's"
    );

    // Past its expiry it no longer applies: the configured rule is back,
    // and what the override admitted in this window still counts (the
    // same algorithm and period keep the place's state: 6 used of 2).
    tokio::time::sleep(Duration::from_millis(3100)).await;
    assert_eq!(limiter.refresh_overrides().await.unwrap(), 0);
    assert_eq!(
        grants(&limiter, "vip").await,
        0,
        "back to the config's limit, the window's 6 grants still counted"
    );
    assert_eq!(cli(&config, &["list"]), "no overrides in force\n");

    // --clear ends one before its expiry.
    cli(
        &config,
        &["override", "later", "--rule", "gcra:9/1m", "--for", "1h"],
    );
    assert_eq!(limiter.refresh_overrides().await.unwrap(), 1);
    let cleared = cli(&config, &["override", "later", "--clear"]);
    assert_eq!(cleared, "later: override cleared\n");
    assert_eq!(limiter.refresh_overrides().await.unwrap(), 0);
}
