//! Limits changed without a restart: the config file given with `--config`
//! is watched (its directory, since editors and Kubernetes ConfigMaps
//! replace a file by rename or symlink swap rather than writing it in
//! place), and SIGHUP asks for a reload too. A valid edit swaps the
//! limiter's policy at once: calls under way finish with the old one. An
//! invalid edit is rejected with the file, the key and the problem, and the
//! old limits stay in force. Only `[limits]` is applied live; a change to any
//! other section is logged as needing a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config::{self, Settings};
use crate::limiter::{Limiter, Policy, Store};
use crate::telemetry::events::{LimitsReloadRejected, LimitsReloaded};
use crate::telemetry::metrics::name_sellers;

/// Edits often come as several file events (truncate, write, rename):
/// wait this long after the first for the rest before reading the file.
const SETTLE: Duration = Duration::from_millis(200);

/// Watches `path` until `stop` is dropped, applying each valid edit of its
/// `[limits]` to `limiter`. `running` is what the worker started with, to
/// tell which other sections changed.
pub fn spawn<S: Store + 'static>(
    path: PathBuf,
    limiter: Arc<Limiter<S>>,
    running: Settings,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let name = path.file_name().map(|n| n.to_owned());
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    let events = tx.clone();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        // Any event in the directory that names the file, names nothing
        // (some backends), or names a `..data`-style entry: a ConfigMap
        // swaps a symlinked directory, so the file's own name may not
        // appear at all.
        let ours = ev.paths.is_empty()
            || ev.paths.iter().any(|p| {
                p.file_name() == name.as_deref()
                    || p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(".."))
            });
        if ours && !matches!(ev.kind, notify::EventKind::Access(_)) {
            let _ = events.send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    #[cfg(unix)]
    {
        let hup = tx.clone();
        let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while signal.recv().await.is_some() {
                if hup.send(()).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    Ok(tokio::spawn(async move {
        // The watcher lives as long as this task.
        let _watcher = watcher;
        let mut applied = limits_of(&running);
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            reload(&path, &limiter, &running, &mut applied);
        }
    }))
}

/// The `[limits]` as they were applied, to skip edits of other sections.
fn limits_of(settings: &Settings) -> String {
    format!("{:?}", settings.limits)
}

/// Everything but `[limits]`, to tell an operator a restart is needed.
fn others_of(settings: &Settings) -> String {
    let mut s = settings.clone();
    s.limits = Default::default();
    format!("{s:?}")
}

fn reload<S: Store>(path: &Path, limiter: &Limiter<S>, running: &Settings, applied: &mut String) {
    let loaded = match config::load(Some(path)) {
        Ok(l) => l,
        Err(e) => {
            return LimitsReloadRejected {
                error: &e.to_string(),
            }
            .emit()
        }
    };
    let policy = match Policy::load(&loaded) {
        Ok(p) => p,
        Err(e) => {
            return LimitsReloadRejected {
                error: &e.to_string(),
            }
            .emit()
        }
    };
    let limits = limits_of(&loaded.settings);
    let restart_needed = others_of(&loaded.settings) != others_of(running);
    if limits == *applied {
        if restart_needed {
            LimitsReloaded {
                file: &path.display().to_string(),
                changed: false,
                named_sellers: 0,
                restart_needed,
            }
            .emit();
        }
        return;
    }
    let named: Vec<String> = policy.named_sellers().map(str::to_owned).collect();
    let count = named.len();
    name_sellers(named);
    limiter.set_policy(policy);
    *applied = limits;
    LimitsReloaded {
        file: &path.display().to_string(),
        changed: true,
        named_sellers: count,
        restart_needed,
    }
    .emit();
}
