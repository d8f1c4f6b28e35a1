//! After Redis lost the limiter's state, this replica writes back its own
//! part of it: the grants it was given before the loss ([`Parts`]), per
//! hash, in one `restore` call each (`lua/restore.lua`).
//!
//! Only with `redis.on_state_loss = "wait"` and a bounded
//! `redis.state_loss_wait`: a loss then holds every rule longer than the
//! bound, unwritten, until the loss plus the bound (`lost_fill`,
//! `lua/common.lua`), and the replicas' restores land within that hold.
//! After it the seller goes on from what the fleet granted before the
//! loss, not from nothing: only what a replica that restarted since (or
//! forgot, past `redis.restore_bytes`) had granted is missing.
//!
//! How a replica learns of a loss: [`Limiter::watch_epoch`], called about
//! once a second by the worker, reads the epoch key; a new epoch other
//! than 0 (a new install's) names a loss. With `redis.topology = cluster`
//! each hash slot has its own epoch (a master that lost its data loses
//! only its slots'): the watch reads the epoch of each slot this replica
//! holds grants in, and restores a slot's hashes when its epoch names a
//! new loss ([`Limiter::watch_slot_epochs`]). Partial losses are not
//! looked for in a cluster (a call's marks and the finds' list would lie
//! in other slots than its seller's keys).
//!
//! A partial loss (a failover to a replica that missed the last writes, a
//! seller's key put back from an older copy) leaves the epoch as it was.
//! Each charging call carries this replica's last grant per seller
//! ([`Seen`]); the call that finds it gone holds the seller and lists the
//! find (`rollback_hold`, `lua/common.lua`). The same watch reads the
//! finds ([`Limiter::watch_rollbacks`]) and writes back, for each, this
//! replica's grants in that seller's hash; the script counts those after
//! the replica's own last grant the state still holds.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use super::core::Limiter;
use super::keys::slot_of;
use super::parts::{lock, Parts, Restorer, SellerPart};
use super::reply::JobsReply;
use super::script::{fnv1a, BlockRead, JobsCall, JobsRequest, Loss, RestoreCall, Seen};
use super::store::Store;
use crate::config::{OnStateLoss, Topology};
use crate::telemetry::events::{GrantsKept, LimiterStateRestored};

/// Restores under way at once: a loss finds every active seller at once.
const AT_ONCE: usize = 16;

/// The hash a find names when the server moved (a failover, a restart
/// from an older save: `server_moved`, `lua/common.lua`): every one.
const EVERY_HASH: &str = "*";

/// What one restore wrote back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreReport {
    /// The loss (µs on Redis' clock): the epoch, or a partial loss's find.
    pub lost_us: u64,
    /// Hashes written back.
    pub hashes: usize,
    /// Units charged back.
    pub units: u64,
    /// Hashes not restored: Redis did not answer, or the epoch named
    /// another loss by then.
    pub failed: usize,
}

impl<S: Store> Limiter<S> {
    /// Keeps this replica's grants (`budget` bytes at most) to write them
    /// back after a loss of Redis' data, as `replica`. Takes effect with
    /// `on_state_loss = wait` and a bounded `state_loss_wait`.
    pub fn with_restore(mut self, replica: impl Into<String>, budget: usize) -> Limiter<S> {
        let replica = replica.into();
        self.restorer = Some(Restorer {
            // 32 bits name a replica among a fleet's few dozen; the mark
            // is one short field per replica in each seller's hash.
            tag: format!("{:08x}", fnv1a(replica.as_bytes()) as u32),
            replica,
            parts: Mutex::new(Parts::new(budget)),
            watch: Mutex::new((None, None)),
            slots: Mutex::default(),
            rollbacks_read: Mutex::new(0),
        });
        self
    }

    /// The restorer and the bound (µs), when restores are on.
    fn restoring(&self) -> Option<(&Restorer, u64)> {
        let r = self.restorer.as_ref()?;
        if self.on_state_loss != Some(OnStateLoss::Wait) {
            return None;
        }
        let bound = self.state_loss_wait?;
        Some((r, u64::try_from(bound.as_micros()).unwrap_or(u64::MAX)))
    }

    /// Keeps what a charging jobs call granted, per rule, at its time on
    /// Redis' clock.
    pub(super) fn record_grants(&self, call: &JobsCall, replies: &[JobsReply]) {
        let Some((r, _)) = self.restoring() else {
            return;
        };
        let mut parts = lock(&r.parts);
        let evicted = parts.evicted();
        for (req, reply) in call.requests.iter().zip(replies) {
            let jobs = usize::try_from(reply.jobs)
                .unwrap_or(0)
                .min(req.costs.len());
            let units: u64 = req.costs[..jobs].iter().sum();
            let at = u64::try_from(reply.head.now_us).unwrap_or(0);
            parts.record(&req.rules, at, units);
            if units > 0 && carries_mark(req) {
                // The script marks every hash the grant charged, the
                // global rules' too (`mark_grant`, `lua/common.lua`).
                let live = u64::try_from(reply.head.reset_after_us).unwrap_or(0);
                for key in marked_keys(req) {
                    parts.mark(key, at, at.saturating_add(live));
                }
            }
        }
        GrantsKept {
            bytes: parts.bytes(),
            evicted: parts.evicted() - evicted,
        }
        .emit();
    }

    /// What a charging call of `requests` carries to find a partial loss:
    /// this replica's tag, so that its grants are marked, and its last
    /// grant in each seller's hash. `None` when restores are off or in a
    /// cluster.
    pub(super) fn seen(&self, requests: &[JobsRequest]) -> Option<Seen> {
        let (r, _) = self.restoring()?;
        if self.topology == Topology::Cluster {
            return None;
        }
        let parts = lock(&r.parts);
        let marks: Vec<Option<(u64, u64)>> = requests
            .iter()
            .map(|q| {
                carries_mark(q)
                    .then(|| parts.marked(&q.block.key))
                    .flatten()
            })
            .collect();
        Some(Seen {
            tag: r.tag.clone(),
            rollbacks: self.keys.rollbacks(),
            server: self.keys.server(),
            marks,
        })
    }

    /// Reads the finds of partial losses since the last read and writes
    /// back, for each, this replica's grants in that seller's hash (the
    /// script keeps those the state lost). Empty when there was none (or restores
    /// are off, or Redis did not answer: the next read tries again).
    pub async fn watch_rollbacks(&self) -> Vec<RestoreReport> {
        let Some((r, _)) = self.restoring() else {
            return Vec::new();
        };
        if self.topology == Topology::Cluster {
            return Vec::new();
        }
        let since = *lock(&r.rollbacks_read);
        let Ok(found) = self
            .store
            .read_rollbacks(&self.keys.rollbacks(), since)
            .await
        else {
            return Vec::new();
        };
        let mut reports = Vec::new();
        for f in found {
            let loss = Loss::Rollback {
                found_us: f.found_us,
            };
            // A seller this replica never granted (or forgot) has no part;
            // a move of the server ('*') finds every seller's hash.
            let parts = if f.key == EVERY_HASH {
                lock(&r.parts).before_each_marked(f.found_us)
            } else {
                lock(&r.parts)
                    .before_in(&f.key, f.found_us)
                    .into_iter()
                    .collect()
            };
            if !parts.is_empty() {
                reports.push(self.restore_parts(loss, parts).await);
            }
            let mut read = lock(&r.rollbacks_read);
            *read = (*read).max(f.found_us);
        }
        reports
    }

    /// Reads the epoch; when it names a loss this replica has not
    /// restored yet, writes back its part ([`Limiter::restore_after`]).
    /// `None` when nothing was restored (no loss, restores off, Redis did
    /// not answer: the next read tries again).
    pub async fn watch_epoch(&self) -> Option<RestoreReport> {
        let (r, _) = self.restoring()?;
        if self.topology == Topology::Cluster {
            return self.watch_slot_epochs(r).await;
        }
        let key = self.keys.epoch(Topology::Single, "");
        let epoch = self.store.read_epoch(&key).await.ok()??;
        {
            let mut watch = lock(&r.watch);
            watch.0 = Some(epoch);
            // 0: a new install's, never a loss.
            if epoch == 0 || watch.1 == Some(epoch) {
                return None;
            }
            watch.1 = Some(epoch);
        }
        Some(self.restore_after(epoch).await)
    }

    /// Redis Cluster: reads the epoch of each hash slot this replica holds
    /// grants in, and for each slot whose epoch names a loss not restored
    /// yet, writes back its part of that slot's hashes. A slot's epoch is
    /// written by the first call that finds the slot empty (which holds
    /// its seller, `lost_fill`), so a lost slot no call has reached yet is
    /// restored once one has. One report for every slot restored (the
    /// latest loss; counts summed); `None` when none was.
    async fn watch_slot_epochs(&self, r: &Restorer) -> Option<RestoreReport> {
        let mut epochs: BTreeMap<u16, String> = BTreeMap::new();
        for key in lock(&r.parts).keys() {
            epochs
                .entry(slot_of(key))
                .or_insert_with(|| self.keys.epoch(Topology::Cluster, key));
        }
        let read: Vec<(u16, Option<u64>)> =
            stream::iter(epochs)
                .map(|(slot, key)| async move {
                    (slot, self.store.read_epoch(&key).await.ok().flatten())
                })
                .buffer_unordered(AT_ONCE)
                .collect()
                .await;
        let mut losses: Vec<(u16, u64)> = Vec::new();
        {
            let mut seen = lock(&r.slots);
            for (slot, epoch) in read {
                // 0: a new install's, never a loss; unanswered or unread:
                // the next watch reads it again.
                let Some(lost) = epoch.filter(|&e| e != 0) else {
                    continue;
                };
                if seen.insert(slot, lost) != Some(lost) {
                    losses.push((slot, lost));
                }
            }
        }
        losses.sort_unstable();
        let mut total: Option<RestoreReport> = None;
        for (slot, lost) in losses {
            let parts: Vec<SellerPart> = lock(&r.parts)
                .before(lost)
                .into_iter()
                .filter(|p| slot_of(&p.key) == slot)
                .collect();
            let report = self.restore_parts(Loss::Epoch(lost), parts).await;
            total = Some(match total {
                None => report,
                Some(t) => RestoreReport {
                    lost_us: t.lost_us.max(report.lost_us),
                    hashes: t.hashes + report.hashes,
                    units: t.units + report.units,
                    failed: t.failed + report.failed,
                },
            });
        }
        total
    }

    /// Writes back this replica's grants before the loss at `lost_us`,
    /// one call per hash.
    pub async fn restore_after(&self, lost_us: u64) -> RestoreReport {
        let parts = match self.restoring() {
            Some((r, _)) => lock(&r.parts).before(lost_us),
            None => Vec::new(),
        };
        self.restore_parts(Loss::Epoch(lost_us), parts).await
    }

    /// Writes back `parts` after `loss`, one call per hash.
    async fn restore_parts(&self, loss: Loss, parts: Vec<SellerPart>) -> RestoreReport {
        let lost_us = loss.at_us();
        let mut report = RestoreReport {
            lost_us,
            hashes: 0,
            units: 0,
            failed: 0,
        };
        let Some((r, bound_us)) = self.restoring() else {
            return report;
        };
        let started = Instant::now();
        let calls = parts.into_iter().map(|part| RestoreCall {
            now_us: None,
            replica: r.replica.clone(),
            loss,
            bound_us,
            epoch: self.keys.epoch(self.topology, &part.key),
            // In a cluster the server key lies in another slot.
            server: (self.topology == Topology::Single).then(|| self.keys.server()),
            mark: part.last_us.map(|at| (r.tag.clone(), at)),
            rules: part.rules,
        });
        let answers: Vec<_> = stream::iter(calls)
            .map(|call| async move { self.store.restore(&call).await })
            .buffer_unordered(AT_ONCE)
            .collect()
            .await;
        for answer in answers {
            match answer {
                Ok(units) if units.iter().all(|&u| u != -1) => {
                    report.hashes += 1;
                    report.units += units.iter().filter(|&&u| u > 0).sum::<i64>() as u64;
                }
                _ => report.failed += 1,
            }
        }
        LimiterStateRestored {
            lost_us,
            partial: matches!(loss, Loss::Rollback { .. }),
            hashes: report.hashes,
            units: report.units,
            failed: report.failed,
            took: started.elapsed(),
        }
        .emit();
        report
    }

    /// How often the worker should call [`Limiter::watch_epoch`]: well
    /// within the bound, so that every replica's part lands before the
    /// hold ends. `None` when restores are off.
    pub fn epoch_watch_interval(&self) -> Option<Duration> {
        let (_, bound_us) = self.restoring()?;
        let quarter = Duration::from_micros(bound_us / 4);
        Some(quarter.clamp(Duration::from_millis(100), Duration::from_secs(1)))
    }
}

/// The hashes a granted request's marks are written in: its seller's,
/// then each other hash its rules charge, once.
fn marked_keys(q: &JobsRequest) -> Vec<&str> {
    let mut keys = vec![q.block.key.as_str()];
    for (at, _) in &q.rules {
        if !keys.contains(&at.key.as_str()) {
            keys.push(at.key.as_str());
        }
    }
    keys
}

/// Whether a request's seller hash carries this replica's mark: it reads
/// the block there and has rules of its own (an unlimited seller keeps no
/// state to go back).
fn carries_mark(q: &JobsRequest) -> bool {
    q.block.read == BlockRead::Field && q.rules.iter().any(|(at, _)| at.key == q.block.key)
}
