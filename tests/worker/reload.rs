//! Limits changed without a restart (issue 8): a worker process watches the
//! config file it was started with, and the limits file that config names
//! (mounted as a Kubernetes ConfigMap mounts it). An invalid edit is rejected with the
//! file, key and problem, and the old limits hold; a valid edit (written
//! the way editors and ConfigMaps do, by rename) is in force within 5 s,
//! as the downstream's rate shows.

use std::time::{Duration, Instant};

use crate::common::procs::{start_worker, BrokerProc, Names, Scratch, TaggedDownstream};
use crate::common::worker::{job, produce};

const SLOW: &str = r#"[{ algorithm = "fixed_window", limit = 2, period = "1s" }]"#;
const FAST: &str = r#"[{ algorithm = "fixed_window", limit = 40, period = "1s" }]"#;
const INVALID: &str = r#"[{ algorithm = "fixed_window", limit = 0, period = "1s" }]"#;

/// Calls that arrived in `[from, from + span)`.
fn calls_in(down: &TaggedDownstream, from: Instant, span: Duration) -> usize {
    down.arrivals()
        .iter()
        .filter(|(_, a)| a.at >= from && a.at < from + span)
        .count()
}

/// Where the limits live, and how an edit reaches them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Source {
    /// `[limits]` of the file given with `--config`: an invalid edit written
    /// in place, a valid one by rename (as editors save).
    ConfigFile,
    /// A separate limits file named by `limits.file`, mounted the way a
    /// Kubernetes ConfigMap is: `limits.toml -> ..data/limits.toml`, `..data
    /// -> ..<timestamp>/`, each edit a new directory and an atomic swap of
    /// the `..data` link.
    ConfigMap,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_edit_is_in_force_within_5_s_and_an_invalid_one_is_rejected() {
    reload_through(Source::ConfigFile).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_limits_file_edit_is_in_force_within_5_s_and_an_invalid_one_is_rejected() {
    reload_through(Source::ConfigMap).await;
}

/// A ConfigMap volume: writes `text` as `limits.toml` in a new timestamped
/// directory and swaps `..data` to it atomically (a rename over the link).
fn configmap_write(mount: &std::path::Path, version: u32, rules: &str) {
    use std::os::unix::fs::symlink;
    let data = format!("..2026_11_23_00_00_0{version}.000000001");
    std::fs::create_dir_all(mount.join(&data)).unwrap();
    std::fs::write(
        mount.join(&data).join("limits.toml"),
        format!("[limits]\ndefault = {rules}\n"),
    )
    .unwrap();
    let tmp = mount.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&data, &tmp).unwrap();
    std::fs::rename(&tmp, mount.join("..data")).unwrap();
    if std::fs::symlink_metadata(mount.join("limits.toml")).is_err() {
        symlink("..data/limits.toml", mount.join("limits.toml")).unwrap();
    }
}

async fn reload_through(source: Source) {
    let dir = Scratch::new("reload");
    let n = Names::new("reload");
    let broker = BrokerProc::start(dir.path(), &n.topics(2));
    let down = TaggedDownstream::start(Duration::ZERO).await;
    let config = |rules| n.config(&broker.bootstrap, rules, "5s");
    let path = config(SLOW).write(dir.path(), "worker");
    let mount = dir.path().join("limits");
    if source == Source::ConfigMap {
        // The config's own [limits] say 40 a second; the limits file (2 a
        // second) is merged over them, so only it can explain the rate.
        std::fs::create_dir_all(&mount).unwrap();
        configmap_write(&mount, 1, SLOW);
        let text = std::fs::read_to_string(config(FAST).write(dir.path(), "worker")).unwrap();
        std::fs::write(
            &path,
            format!("{text}file = \"{}\"\n", mount.join("limits.toml").display()),
        )
        .unwrap();
    }
    let worker = start_worker(dir.path(), "worker", &path, &down.url("w"));
    let records: Vec<_> = (0..600).map(|i| job(&format!("r{i}"), "seller")).collect();
    produce(&broker.bootstrap, &n.jobs, &records).await;
    down.wait_distinct("the first calls", 4, Duration::from_secs(30))
        .await;

    // An invalid edit: rejected, and 2 a second holds.
    match source {
        Source::ConfigFile => std::fs::write(
            &path,
            std::fs::read_to_string(config(INVALID).write(dir.path(), "invalid")).unwrap(),
        )
        .unwrap(),
        Source::ConfigMap => configmap_write(&mount, 2, INVALID),
    }
    let rejected_by = Instant::now() + Duration::from_secs(5);
    let rejection = loop {
        let line = worker
            .log_events()
            .into_iter()
            .find(|e| e.message == "config edit rejected; the limits in force stay");
        if let Some(e) = line {
            break e;
        }
        assert!(
            Instant::now() < rejected_by,
            "no rejection logged within 5 s:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let error = rejection.field("error").unwrap_or("").to_owned();
    let file = match source {
        Source::ConfigFile => "worker.toml",
        Source::ConfigMap => "limits.toml",
    };
    assert!(
        error.contains(file) && error.contains("limits.default"),
        "the rejection names the file ({file}) and the key: {error}"
    );
    let held_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let while_invalid = calls_in(&down, held_from, Duration::from_secs(3));
    assert!(
        while_invalid <= 8,
        "{while_invalid} calls in 3 s with a limit of 2 a second: the invalid edit changed the limits"
    );

    // A valid edit: 40 a second within 5 s.
    match source {
        Source::ConfigFile => {
            let fresh = config(FAST).write(dir.path(), "worker.new");
            std::fs::rename(&fresh, &path).unwrap();
        }
        Source::ConfigMap => configmap_write(&mount, 3, FAST),
    }
    let edited = Instant::now();
    let deadline = edited + Duration::from_secs(8);
    let in_force_after = loop {
        // The first 500 ms window after the edit with more calls than the
        // old limit could allow in it.
        let now = Instant::now();
        let mut t = edited;
        let mut found = None;
        while t + Duration::from_millis(500) <= now {
            if calls_in(&down, t, Duration::from_millis(500)) > 4 {
                found = Some(t - edited);
                break;
            }
            t += Duration::from_millis(100);
        }
        if let Some(f) = found {
            break f;
        }
        assert!(
            now < deadline,
            "the new limit was not in force 8 s after the edit:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reloaded = worker
        .log_events()
        .into_iter()
        .any(|e| e.message == "limits reloaded; in force on this replica now");
    eprintln!(
        "reload ({source:?}): invalid edit rejected ({while_invalid} calls in the 3 s after it, limit 2/s); \
         the new limit (40/s) was in force {in_force_after:?} after the edit"
    );
    assert!(reloaded, "no 'limits reloaded' line");
    assert!(
        in_force_after <= Duration::from_secs(5),
        "the edit took {in_force_after:?}"
    );
}
