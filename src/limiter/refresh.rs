//! What a replica reads and writes in Redis beside its limiter calls, as
//! [`Limiter`] methods on the [`RedisStore`]: the operators' overrides and
//! pauses (read by every replica in turn), the wait board, and a seller's
//! learnt factor for `limits show`. What each value means is decided in
//! the pure files below this one (`overrides.rs`, `pauses.rs`,
//! `waits.rs`, `learn.rs`); this file only moves it.

use std::sync::Arc;
use std::time::Duration;

use super::core::Limiter;
use super::learn::{digest, scaled, LearnState, Learning, FULL};
use super::overrides;
use super::pauses::Pauses;
use super::policy::Resolved;
use super::redis::{RedisError, RedisStore};
use super::waits::{fresh, sweeps, Report, BOARD_LIFE};

impl Limiter<RedisStore> {
    /// Reads the temporary overrides from Redis and puts those in force now
    /// in place; returns how many there are.
    pub async fn refresh_overrides(&self) -> Result<usize, RedisError> {
        let fields = self.store.read_hash(&self.keys.overrides()).await?;
        // Ends are on Redis' clock (the CLI counts `--for` from its
        // `TIME`): every replica drops an override at the same moment.
        let live = overrides::in_force(&fields, self.store.time_ms().await?);
        let n = live.len();
        self.set_overrides(live);
        Ok(n)
    }

    /// Reads the operators' pauses from Redis and holds those in force
    /// now; returns them. On an error the last ones read stay (a pause is
    /// not lifted because Redis did not answer).
    pub async fn refresh_pauses(&self) -> Result<Arc<Pauses>, RedisError> {
        let fields = self.store.read_hash(&self.keys.pauses()).await?;
        let redis_ms = self.store.time_ms().await?;
        self.set_pauses(Pauses::in_force_at(&fields, redis_ms, unix_ms()));
        Ok(self.pauses())
    }

    /// Writes this replica's report and, once per [`STALE`](super::waits::STALE) (see
    /// [`sweeps`]), deletes the reports gone stale.
    pub async fn publish_waits(&self, worker: &str, report: &Report) -> Result<(), RedisError> {
        let key = self.keys().waits();
        let json = serde_json::to_string(report).unwrap_or_default();
        self.store()
            .set_hash_fields(&key, &[(worker.to_owned(), json)], BOARD_LIFE)
            .await?;
        if !sweeps(report.at_ms) {
            return Ok(());
        }
        let fields = self.store().read_hash(&key).await?;
        let (_, stale) = fresh(&fields, report.at_ms);
        if !stale.is_empty() {
            self.store().delete_fields(&key, &stale).await?;
        }
        Ok(())
    }

    /// Every fresh report on the board, by worker id.
    pub async fn read_waits(&self, now_ms: u64) -> Result<Vec<(String, Report)>, RedisError> {
        let fields = self.store().read_hash(&self.keys().waits()).await?;
        Ok(fresh(&fields, now_ms).0)
    }

    /// `seller`'s learnt limit now (Redis' clock): `None` when learning is
    /// off, the seller is unlimited, or nothing is learnt for its rules in
    /// force.
    pub async fn learning(&self, seller: &str) -> Result<Option<Learning>, RedisError> {
        let policy = self.policy();
        let Some(terms) = policy.learn() else {
            return Ok(None);
        };
        let at = self.keys.block_at(seller);
        let Resolved::Limited { seller: own, .. } = policy.resolve(seller) else {
            return Ok(None);
        };
        let Some(state) = self
            .store
            .hash_field(&at.key, "learn")
            .await?
            .and_then(|v| LearnState::parse(&v))
        else {
            return Ok(None);
        };
        let now_us = self.store.time_ms().await? * 1000;
        let factor_ppm = state.factor_at(now_us, terms.rise_ppm_per_s, &digest(own));
        if factor_ppm >= FULL {
            return Ok(None);
        }
        let missing_us = (FULL - factor_ppm) * 1_000_000 / terms.rise_ppm_per_s;
        Ok(Some(Learning {
            factor_ppm,
            dropped_at_ms: state.at_us / 1000,
            full_in: Duration::from_micros(missing_us),
            configured: own.to_vec(),
            effective: own.iter().map(|r| scaled(r, factor_ppm)).collect(),
        }))
    }
}

/// Now on this host's clock, in Unix ms (a pause's end moved onto it is
/// judged with it; see [`Pauses::in_force_at`]).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
