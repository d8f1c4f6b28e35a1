//! Shutdown: no new records; what waits is left uncommitted for the next
//! owner; work under way is awaited (within `worker.shutdown_timeout`);
//! then the final commit, and the fleet's slots and the units of granted
//! jobs left uncalled given back.

use std::time::Duration;

use crate::limiter::BatchDecision;

use super::super::ports::{Clock, CommitError, Ports, Source};
use super::super::timers::after;
use super::{Engine, Event, Summary};

/// How long shutdown waits for the broker to acknowledge the final commit.
const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause before a refused final commit is tried again.
const FINAL_COMMIT_RETRY: Duration = Duration::from_millis(200);

impl<X: Ports> Engine<X> {
    pub(super) async fn drain(mut self) -> Summary {
        // No more records: the consumer stops handing them over (and keeps
        // serving the final commit).
        self.deps.records.close();
        tracing::info!(
            in_flight = self.tasks,
            "shutting down: no new records; waiting for in-flight work"
        );
        // Waiting jobs stay uncommitted: whoever owns their partitions next
        // gets them. Only work already under way is awaited.
        self.flush_asks();
        let waiting_at_stop = self.scheduler.clear_waiting();
        let parked_at_stop = self.tiers.clear();
        let deadline = after(self.deps.clock.now(), self.settings.worker.shutdown_timeout);
        while self.tasks > 0 {
            tokio::select! {
                ev = tokio::time::timeout_at(deadline, self.rx.recv()) => match ev {
                    Ok(Some(ev)) => {
                        self.on_event_draining(ev);
                        // An ask made while draining is answered, and its
                        // slots given back, like any other under way.
                        self.flush_asks();
                    }
                    Ok(None) | Err(_) => break,
                },
                // A rebalance while draining (another member joins or
                // leaves) waits for the work under way as at any time.
                Some(pe) = self.deps.partitions.recv() => self.on_partitions(pe),
            }
            self.settle_revokes();
        }
        // No revoke waits for this engine any more: those begun are let go
        // (what was abandoned stays uncommitted), later ones do not wait.
        self.deps.partitions.close();
        while let Ok(pe) = self.deps.partitions.try_recv() {
            self.on_partitions(pe);
        }
        self.settle_revokes();
        self.handoff.clear();
        let abandoned = self.tasks;
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                "shutdown timeout: in-flight work abandoned, its records stay uncommitted"
            );
        }
        let committed_partitions = self.commit_all().await;
        // Work abandoned above still holds its leases: they lapse.
        self.scheduler.forget_all();
        self.slots.finish().await;
        // The units of jobs left uncalled (paced, granted as it stopped),
        // dropped above, go back to their sellers' rules.
        self.charges.finish().await;
        Summary {
            abandoned,
            committed_partitions,
            waiting_at_stop,
            parked_at_stop,
        }
    }

    fn on_event_draining(&mut self, ev: Event) {
        match ev {
            Event::RunEnded { unused, .. } => {
                self.tasks -= 1;
                self.unused_ended(&unused);
                for p in &unused {
                    self.forget(p);
                }
            }
            Event::Permit {
                seller,
                result,
                asked_at,
                ..
            } => {
                self.tasks -= 1;
                // Not used: the slots and the units it took go back now.
                if let Ok(BatchDecision::Granted(mut g)) = result {
                    drop(self.charges.hold(&seller, &mut g));
                    drop(self.slots.hold(&seller, g.leases, asked_at));
                }
            }
            other => self.on_event(other),
        }
    }

    /// The final commit: every finished prefix, acknowledged by the broker
    /// (failures are counted and logged by the consumer). Returns how many
    /// partitions were committed. A commit the broker refuses is tried
    /// again until [`FINAL_COMMIT_TIMEOUT`]: one made while the group
    /// rebalances (a member joining or leaving as this one stops) is refused
    /// with `REBALANCE_IN_PROGRESS` or, once the generation moved on,
    /// `ILLEGAL_GENERATION`, and the same offsets go through once the
    /// rebalance is over (the consumer keeps polling meanwhile, which is
    /// what lets it end).
    async fn commit_all(&mut self) -> usize {
        let deadline = after(self.deps.clock.now(), FINAL_COMMIT_TIMEOUT);
        loop {
            let commit = self.deps.source.commit_all();
            match tokio::time::timeout_at(deadline, commit).await {
                Ok(Ok(n)) => return n,
                Ok(Err(CommitError::Refused(_)))
                    if after(self.deps.clock.now(), FINAL_COMMIT_RETRY) < deadline =>
                {
                    tokio::time::sleep(FINAL_COMMIT_RETRY).await;
                }
                Ok(Err(_)) => return 0,
                Err(_) => {
                    tracing::warn!(timeout = ?FINAL_COMMIT_TIMEOUT, "final commit got no answer in time; the next owner redoes the uncommitted records");
                    return 0;
                }
            }
        }
    }
}
