//! The shared state every replica reads from Redis on a timer: temporary
//! overrides (`limits override`, every second) and operators' pauses
//! (`limits pause`, four times a second), so that every replica applies
//! them together. A read that fails keeps the last one and says why.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::limiter::{Limiter, RedisStore};
use crate::telemetry::events::{
    PausesRead, SharedState, SharedStateUnreadable, WaitBoardUnwritable,
};

/// Reads the overrides now, then every `limiter::overrides::REFRESH`.
pub(super) async fn overrides(limiter: Arc<Limiter<RedisStore>>) -> JoinHandle<()> {
    read_overrides(&limiter).await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(crate::limiter::overrides::REFRESH).await;
            read_overrides(&limiter).await;
        }
    })
}

async fn read_overrides(limiter: &Limiter<RedisStore>) {
    if let Err(e) = limiter.refresh_overrides().await {
        SharedStateUnreadable {
            what: SharedState::Overrides,
            error: &e.to_string(),
        }
        .emit();
    }
}

/// Writes this replica's sellers' waits (the last report's, see
/// `telemetry::events::latest_waits`) to the wait board every
/// `limiter::waits::EVERY`, for `limits show SELLER`. A write that fails
/// is logged and tried again at the next turn: the board is for operators,
/// nothing waits on it.
pub(super) fn waits(limiter: Arc<Limiter<RedisStore>>, worker: String) -> JoinHandle<()> {
    use crate::limiter::waits::{Report, Wait, EVERY};
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(EVERY).await;
            let sellers = crate::telemetry::events::latest_waits()
                .into_iter()
                .map(|w| Wait {
                    seller: w.seller,
                    jobs: w.jobs,
                    units: w.units,
                    oldest_ms: w.oldest.as_millis() as u64,
                    drain_ms: w.drain.map(|d| d.as_millis() as u64),
                    held_by: w.held_by,
                })
                .collect();
            let report = Report {
                at_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                sellers,
            };
            if let Err(e) = limiter.publish_waits(&worker, &report).await {
                WaitBoardUnwritable {
                    error: &e.to_string(),
                }
                .emit();
            }
        }
    })
}

/// Reads the limiter's epoch and the finds of partial losses on a timer
/// (`Limiter::watch_epoch`, `Limiter::watch_rollbacks`): when Redis has
/// lost its state, or part of it, this replica writes back its part of it
/// within the loss's hold. `None` when restores are off (`redis.on_state_loss
/// = "admit"`, an unbounded `state_loss_wait`, a cluster).
pub(super) fn epoch(limiter: Arc<Limiter<RedisStore>>) -> Option<JoinHandle<()>> {
    let every = limiter.epoch_watch_interval()?;
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            // A restore tells itself (LimiterStateRestored); a failed
            // read is tried again at the next turn.
            let _ = limiter.watch_epoch().await;
            let _ = limiter.watch_rollbacks().await;
        }
    }))
}

/// Reads the pauses now and every `limiter::pauses::REFRESH`, so a pause
/// stops every replica's calls within a second.
pub(super) fn pauses(limiter: Arc<Limiter<RedisStore>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = None;
        loop {
            match limiter.refresh_pauses().await {
                Ok(p) => {
                    PausesRead {
                        sellers: p.sellers.len(),
                        all: p.all.is_some(),
                        changed: last.as_ref().is_some_and(|l| *l != p)
                            || (last.is_none() && !p.is_empty()),
                    }
                    .emit();
                    last = Some(p);
                }
                Err(e) => SharedStateUnreadable {
                    what: SharedState::Pauses,
                    error: &e.to_string(),
                }
                .emit(),
            }
            tokio::time::sleep(crate::limiter::pauses::REFRESH).await;
        }
    })
}
