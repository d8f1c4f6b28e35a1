//! Limits changed without a restart: the config file given with `--config`
//! and the limits file it names (`limits.file`) are watched (their directories, since editors and Kubernetes ConfigMaps
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

/// Why the config file cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Watcher(#[from] notify::Error),
    #[error("watching {dir} for limit edits")]
    Watch {
        dir: String,
        #[source]
        source: notify::Error,
    },
    #[error(transparent)]
    Signal(std::io::Error),
}

/// Watches the config file (when there is one) and the limits file it
/// names (`limits.file`, when set) until the task is aborted, applying each
/// valid edit of `[limits]` to `limiter`. `running` is what the worker
/// started with, to tell which other sections changed.
pub fn spawn<S: Store + 'static>(
    config_file: Option<PathBuf>,
    limiter: Arc<Limiter<S>>,
    running: Settings,
) -> Result<tokio::task::JoinHandle<()>, ReloadError> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let watched: Vec<PathBuf> = config_file
        .iter()
        .chain(running.limits.file.iter())
        .cloned()
        .collect();
    let watcher = watch(&watched, tx.clone())?;
    let shown = watched
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    #[cfg(unix)]
    forward_hangups(tx.clone())?;
    drop(tx);
    Ok(tokio::spawn(async move {
        // The watcher lives as long as this task.
        let _watcher = watcher;
        let mut applied = limits_of(&running);
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            reload(
                config_file.as_deref(),
                &shown,
                &limiter,
                &running,
                &mut applied,
            );
            // The new limits' shapes, so that no call waits for their load
            // (nothing for those loaded already).
            let prepared = limiter.prepare_shapes().await;
            crate::telemetry::events::ShapesPrepared {
                error: prepared.err().map(|e| e.to_string()).as_deref(),
            }
            .emit();
        }
    }))
}

/// Watches the directories of `watched` (not the files: an editor or a
/// ConfigMap replaces a file, which ends a watch on it); each event that may
/// concern a watched file sends on `tx`.
fn watch(
    watched: &[PathBuf],
    tx: mpsc::UnboundedSender<()>,
) -> Result<notify::RecommendedWatcher, ReloadError> {
    let names: Vec<_> = watched
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_owned()))
        .collect();
    let events = tx;
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        // Any event in a directory that names a watched file, names nothing
        // (some backends), or names a `..data`-style entry: a ConfigMap
        // swaps a symlinked directory, so the file's own name may not
        // appear at all.
        let ours = ev.paths.is_empty()
            || ev.paths.iter().any(|p| {
                p.file_name().is_some_and(|n| {
                    names.iter().any(|name| name == n) || n.to_string_lossy().starts_with("..")
                })
            });
        if ours && !matches!(ev.kind, notify::EventKind::Access(_)) {
            let _ = events.send(());
        }
    })?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    for path in watched {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        if !dirs.contains(&dir) {
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|source| ReloadError::Watch {
                    dir: dir.display().to_string(),
                    source,
                })?;
            dirs.push(dir);
        }
    }
    Ok(watcher)
}

/// SIGHUP asks for a reload too.
#[cfg(unix)]
fn forward_hangups(hup: mpsc::UnboundedSender<()>) -> Result<(), ReloadError> {
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(ReloadError::Signal)?;
    tokio::spawn(async move {
        while signal.recv().await.is_some() {
            if hup.send(()).is_err() {
                break;
            }
        }
    });
    Ok(())
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

fn reload<S: Store>(
    config_file: Option<&Path>,
    shown: &str,
    limiter: &Limiter<S>,
    running: &Settings,
    applied: &mut String,
) {
    let loaded = match config::load(config_file) {
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
                file: shown,
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
        file: shown,
        changed: true,
        named_sellers: count,
        restart_needed,
    }
    .emit();
}

/// Catches SIGHUP when no file is watched: logs that there is nothing to
/// reload instead of letting the signal's default action end the process.
/// Returns how many it caught (for tests).
#[cfg(unix)]
pub fn ignore_hangup() -> std::io::Result<std::sync::Arc<std::sync::atomic::AtomicU64>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let caught = std::sync::Arc::new(AtomicU64::new(0));
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let count = caught.clone();
    tokio::spawn(async move {
        while signal.recv().await.is_some() {
            count.fetch_add(1, Ordering::SeqCst);
            tracing::info!("SIGHUP: no config file is watched, nothing to reload");
        }
    });
    Ok(caught)
}

#[cfg(test)]
mod tests {
    /// Issue 20, defect 8: SIGHUP killed a worker that watched no file.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_hangup_with_nothing_watched_is_caught_not_fatal() {
        let caught = super::ignore_hangup().expect("a SIGHUP handler");
        // SAFETY: sends a signal to this process; the handler above is
        // installed, so its default action (terminate) does not run.
        unsafe { libc::kill(libc::getpid(), libc::SIGHUP) };
        for _ in 0..100 {
            if caught.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("SIGHUP was not caught");
    }
}
