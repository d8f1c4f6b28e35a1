//! The limiter's calls and their failures: calls sent and coalesced, each
//! Redis call's latency, a lost call's cancel, the failure policy deciding
//! instead, the limiter's state lost, slots of `max_in_flight` not given
//! back, units of granted jobs never called given back.

use std::time::Duration;

use super::{secs, Event};
use crate::telemetry::metrics::{metrics, KindLabel};
use crate::telemetry::Every;

/// A limiter call sent (to Redis, or answered by the failure policy).
#[derive(Debug)]
pub struct LimiterCalled;

impl Event for LimiterCalled {
    const NAME: &'static str = "LimiterCalled";

    fn record(&self) {
        metrics().limiter_calls.inc();
    }
}

/// One Redis call of the limiter: its latency, and the kind of its failure.
#[derive(Debug)]
pub struct RedisCalled {
    pub kind: &'static str,
    pub took: Duration,
    pub error: Option<&'static str>,
}

impl Event for RedisCalled {
    const NAME: &'static str = "RedisCalled";

    fn record(&self) {
        let m = metrics();
        m.redis_call_duration
            .get_or_create(&KindLabel { kind: self.kind })
            .observe(secs(self.took));
        if let Some(kind) = self.error {
            m.limiter_errors.get_or_create(&KindLabel { kind }).inc();
        }
    }
}

/// A jobs call failed after it was sent (a timeout, a lost connection), so
/// its cancel went out (`lua/calls.lua`): `refunded` units given back,
/// `tombstones` requests made to charge nothing when the call runs, or the
/// cancel's own `error` (its sellers may then stay charged for units they
/// were not told of, until their rules drain).
#[derive(Debug)]
pub struct JobsCallCancelled<'a> {
    pub requests: usize,
    pub refunded: u64,
    pub tombstones: usize,
    pub error: Option<&'a str>,
}

impl Event for JobsCallCancelled<'_> {
    const NAME: &'static str = "JobsCallCancelled";

    fn record(&self) {
        // A Redis that hangs fails every call, and each one's cancel with
        // it: one line per interval.
        static FAILED: Every = Every::new(Duration::from_secs(10));
        match self.error {
            None => tracing::info!(
                requests = self.requests,
                refunded = self.refunded,
                tombstones = self.tombstones,
                "cancelled a limiter call whose answer was lost"
            ),
            Some(error) => {
                if let Some(more) = FAILED.tick() {
                    tracing::warn!(
                        requests = self.requests,
                        error,
                        more_since_last_line = more,
                        "could not cancel a limiter call whose answer was lost; its sellers stay charged for it"
                    );
                }
            }
        }
    }
}

/// A coalesced limiter call went out carrying `asks` sellers' asks.
#[derive(Debug)]
pub struct LimiterCallCoalesced {
    pub asks: usize,
}

impl Event for LimiterCallCoalesced {
    const NAME: &'static str = "LimiterCallCoalesced";

    fn record(&self) {
        metrics().limiter_asks_per_call.observe(self.asks as f64);
    }
}

/// The limiter could not answer; the failure policy decided instead.
#[derive(Debug)]
pub struct LimiterUnavailable<'a> {
    pub error: &'a str,
    pub policy: &'a str,
    pub hold: Duration,
    /// Failed calls in a row, this one included.
    pub in_a_row: u32,
    /// Jobs let through anyway (fail_open, local).
    pub admitted: usize,
}

impl Event for LimiterUnavailable<'_> {
    const NAME: &'static str = "LimiterUnavailable";

    fn record(&self) {
        // Every seller's call fails while Redis is out: one line per interval.
        static LOG: Every = Every::new(Duration::from_secs(5));
        metrics()
            .jobs_admitted_without_redis
            .inc_by(self.admitted as u64);
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                error = self.error,
                policy = self.policy,
                admitted = self.admitted,
                hold_ms = self.hold.as_millis() as u64,
                in_a_row = self.in_a_row,
                more_since_last_line = more,
                "limiter unavailable"
            );
        }
    }
}

/// A limiter call found the state's epoch gone: Redis lost the limiter's
/// state. One call per loss fleet-wide finds it (per hash slot in a
/// cluster).
#[derive(Debug)]
pub struct LimiterStateLost<'a> {
    /// The epoch key, which names the hash slot in a cluster.
    pub epoch: &'a str,
    /// `redis.on_state_loss`.
    pub on_loss: &'static str,
    /// `redis.state_loss_wait`: the longest a seller is held.
    pub max_wait: Option<Duration>,
}

impl Event for LimiterStateLost<'_> {
    const NAME: &'static str = "LimiterStateLost";

    fn record(&self) {
        // A cluster's master that lost its data is found once per slot.
        static LOG: Every = Every::new(Duration::from_secs(10));
        metrics().limiter_state_lost.inc();
        if let Some(more) = LOG.tick() {
            let what = match (self.on_loss, self.max_wait) {
                ("wait", None) => "sellers whose state is gone wait up to one period per rule (redis.on_state_loss = wait)".to_owned(),
                ("wait", Some(max)) => format!(
                    "sellers whose state is gone wait up to one period per rule, and at most {} (redis.state_loss_wait)",
                    humantime::format_duration(max)
                ),
                _ => "sellers whose state is gone start fresh and may get one extra window (redis.on_state_loss = admit)".to_owned(),
            };
            tracing::warn!(
                epoch = self.epoch,
                on_state_loss = self.on_loss,
                more_since_last_line = more,
                "Redis has lost the limiter's state (a restart without persistence, a failover, an eviction, or a new key_prefix): {what}"
            );
        }
    }
}

/// A charging call found a seller's state gone back behind this
/// replica's own grants (a partial loss the epoch cannot see), held the
/// seller and listed the find for every replica's restore
/// (`rollback_hold`, `lua/common.lua`).
#[derive(Debug)]
pub struct LimiterStateRolledBack {
    /// `redis.state_loss_wait`: how long the seller is held.
    pub max_wait: Option<Duration>,
}

impl Event for LimiterStateRolledBack {
    const NAME: &'static str = "LimiterStateRolledBack";

    fn record(&self) {
        // A failover that missed writes is found once per seller it hit.
        static LOG: Every = Every::new(Duration::from_secs(10));
        metrics().limiter_rollbacks_found.inc();
        if let Some(more) = LOG.tick() {
            tracing::warn!(
                max_wait_ms = self.max_wait.map(|w| w.as_millis() as u64),
                more_since_last_line = more,
                "a seller's limiter state in Redis went back behind this replica's grants (a failover to a replica that missed writes, or a key restored from an older copy): the seller is held while every replica writes back its grants"
            );
        }
    }
}

/// A charging call's grants were kept for restores: the bytes now held,
/// and the sellers forgotten for `redis.restore_bytes` to make room.
#[derive(Debug)]
pub struct GrantsKept {
    pub bytes: usize,
    pub evicted: u64,
}

impl Event for GrantsKept {
    const NAME: &'static str = "GrantsKept";

    fn record(&self) {
        let m = metrics();
        m.limiter_restore_bytes
            .set(i64::try_from(self.bytes).unwrap_or(i64::MAX));
        if self.evicted > 0 {
            m.limiter_restore_evicted.inc_by(self.evicted);
            static LOG: Every = Every::new(Duration::from_secs(60));
            if let Some(more) = LOG.tick() {
                tracing::warn!(
                    bytes = self.bytes,
                    more_since_last_line = more,
                    "redis.restore_bytes is full: the sellers granted least recently are forgotten, and would not be restored after a loss of Redis' data"
                );
            }
        }
    }
}

/// This replica wrote back its part of the limiter's state after a loss
/// (`lua/restore.lua`): its grants before the loss, per hash.
#[derive(Debug)]
pub struct LimiterStateRestored {
    /// The loss restored (µs on Redis' clock): the epoch, or the find of a
    /// partial loss.
    pub lost_us: u64,
    /// A partial loss (one seller's state went back), not a whole one.
    pub partial: bool,
    /// Hashes (sellers, and the global rules') written back.
    pub hashes: usize,
    /// Units charged back.
    pub units: u64,
    /// Hashes whose restore failed (Redis did not answer) or came too late
    /// (the epoch names another loss).
    pub failed: usize,
    pub took: Duration,
}

impl Event for LimiterStateRestored {
    const NAME: &'static str = "LimiterStateRestored";

    fn record(&self) {
        metrics().limiter_units_restored.inc_by(self.units);
        if self.failed > 0 {
            tracing::warn!(
                lost_us = self.lost_us,
                partial = self.partial,
                hashes = self.hashes,
                units = self.units,
                failed = self.failed,
                took_ms = self.took.as_millis() as u64,
                "restored this replica's part of the limiter's state after a loss; some hashes were not restored (Redis did not answer, or lost its data again)"
            );
        } else {
            tracing::info!(
                lost_us = self.lost_us,
                partial = self.partial,
                hashes = self.hashes,
                units = self.units,
                took_ms = self.took.as_millis() as u64,
                "restored this replica's part of the limiter's state after a loss"
            );
        }
    }
}

/// A new install's first limiter call found no epoch and wrote it as
/// "never lost": the consumer group has never committed, so there was no
/// state to lose, and no seller waits. One call per install finds it.
#[derive(Debug)]
pub struct LimiterStateStarted<'a> {
    /// The epoch key, which names the hash slot in a cluster.
    pub epoch: &'a str,
}

impl Event for LimiterStateStarted<'_> {
    const NAME: &'static str = "LimiterStateStarted";

    fn record(&self) {
        tracing::info!(
            epoch = self.epoch,
            "a new install: the consumer group has never committed, so the limiter's state starts empty and no seller waits"
        );
    }
}

/// A new install's first limiter call looked outside Redis first
/// (`Limiter::set_install_check`): whether the consumer group had still
/// never committed, and whether this replica's start positions are
/// committed now. `new: false` reads a missing limiter state as lost from
/// here (at worst sellers wait `redis.state_loss_wait` once).
#[derive(Debug)]
pub struct InstallChecked<'a> {
    pub new: bool,
    /// Why the install is not taken for new (none when it is).
    pub why: Option<&'a str>,
}

impl Event for InstallChecked<'_> {
    const NAME: &'static str = "InstallChecked";

    fn record(&self) {
        match self.why {
            None => tracing::info!(
                "a new install: the consumer group had never committed, and this replica's start positions are committed before its first limiter call"
            ),
            Some(why) => tracing::info!(
                why,
                "not a new install after all: a missing limiter state is read as lost"
            ),
        }
    }
}

/// Slots of a seller's `max_in_flight` could not be given back (Redis did
/// not answer): they stay taken until their lease lapses, and the seller
/// runs below its cap meanwhile.
#[derive(Debug)]
pub struct SlotsNotReturned<'a> {
    pub seller: &'a str,
    pub slots: usize,
    pub error: &'a str,
}

impl Event for SlotsNotReturned<'_> {
    const NAME: &'static str = "SlotsNotReturned";

    fn record(&self) {
        tracing::warn!(
            seller = self.seller,
            slots = self.slots,
            error = self.error,
            "could not give back slots of max_in_flight; they lapse with their lease (limits.slot_lease)"
        );
    }
}

/// Units of a grant that no call used (its jobs' partition was revoked,
/// or the replica stopped, before the calls) were given back to the
/// seller's rules, or could not be (`error`: they stay charged until the
/// rules drain them, as before they were given back).
#[derive(Debug)]
pub struct UnitsGivenBack<'a> {
    pub seller: &'a str,
    pub units: u64,
    pub error: Option<&'a str>,
}

impl Event for UnitsGivenBack<'_> {
    const NAME: &'static str = "UnitsGivenBack";

    fn record(&self) {
        match self.error {
            None => {
                metrics().units_given_back.inc_by(self.units);
                tracing::debug!(
                    seller = self.seller,
                    units = self.units,
                    "gave back the units of granted jobs never called here"
                );
            }
            Some(error) => {
                // A Redis that is down fails every give-back with it: one
                // line per interval.
                static FAILED: Every = Every::new(Duration::from_secs(10));
                if let Some(more) = FAILED.tick() {
                    tracing::warn!(
                        seller = self.seller,
                        units = self.units,
                        error,
                        more_since_last_line = more,
                        "could not give back the units of granted jobs never called here; they stay charged until the seller's rules drain them"
                    );
                }
            }
        }
    }
}

/// The limiter's generated functions for the rule lists in force
/// (`limiter::shape`) were loaded, at startup or after a reload of the
/// limits; or could not be, and each loads with its first call.
#[derive(Debug)]
pub struct ShapesPrepared<'a> {
    /// Why they could not be loaded; `None` when they were.
    pub error: Option<&'a str>,
}

impl Event for ShapesPrepared<'_> {
    const NAME: &'static str = "ShapesPrepared";

    fn record(&self) {
        match self.error {
            None => {
                tracing::debug!("loaded the limiter's generated functions for the limits in force")
            }
            Some(error) => tracing::warn!(
                error,
                "could not load the limiter's generated functions; each loads with its first call"
            ),
        }
    }
}

inherent_emit!(
    ShapesPrepared<'_>,
    LimiterCalled,
    RedisCalled,
    JobsCallCancelled<'_>,
    LimiterCallCoalesced,
    LimiterUnavailable<'_>,
    LimiterStateLost<'_>,
    LimiterStateStarted<'_>,
    InstallChecked<'_>,
    LimiterStateRestored,
    LimiterStateRolledBack,
    GrantsKept,
    SlotsNotReturned<'_>,
    UnitsGivenBack<'_>
);
