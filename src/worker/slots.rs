//! Slots of a seller's `max_in_flight`, held across the fleet: a grant of
//! a capped seller takes one per job in Redis (`lua/slots.lua`), and the
//! job holds it as a [`Lease`] until its call is answered or will not be
//! made. A lease gives its slot back when dropped, wherever that happens
//! (an answer, a revoke, a 429 that puts the job back, shutdown), so no
//! path can forget it; a replica that dies gives nothing back, and its
//! slots lapse with their lease (`limits.slot_lease`).
//!
//! Dropping only queues the lease; one task gives the queued ones back,
//! per seller in one call, off the engine's loop.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::telemetry::events::SlotsNotReturned;

use super::ports::Permits;

/// How long shutdown waits for the last slots to go back.
const FINAL_RETURN_TIMEOUT: Duration = Duration::from_secs(2);

type Returned = (Arc<str>, String);

/// Starts the task that gives slots back, given the queue it reads.
type StartGiveBack = Box<dyn FnOnce(mpsc::UnboundedReceiver<Returned>) -> JoinHandle<()> + Send>;

/// One granted job's slot; given back when dropped.
pub struct Lease {
    seller: Arc<str>,
    id: String,
    back: mpsc::UnboundedSender<Returned>,
    /// When Redis may let another call take the slot, by this replica's
    /// clock: no later than the lease's real end (see [`Lease::covers`]).
    lapses_at: Instant,
}

impl Lease {
    /// Whether a call starting at `now` and lasting up to `call` ends
    /// before the slot may lapse (issue 53): past that, another replica
    /// may hold the slot and the call would go over `max_in_flight`.
    pub(super) fn covers(&self, now: Instant, call: Duration) -> bool {
        now.checked_add(call)
            .is_some_and(|end| end <= self.lapses_at)
    }

    /// A pacer's job, whose go-at is `by` after its grant's answer: Redis
    /// leases the grant's slots from its last unit's go-at, so this job's
    /// slot lasts at least that much longer.
    pub(super) fn defer(&mut self, by: Duration) {
        self.lapses_at = super::timers::after(self.lapses_at, by);
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Lease").field(&self.id).finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The task is gone only at the very end of shutdown: the slot
        // lapses with its lease then.
        let _ = self
            .back
            .send((self.seller.clone(), std::mem::take(&mut self.id)));
    }
}

/// The engine's side of the fleet's slots.
pub(super) struct FleetSlots {
    back: Option<mpsc::UnboundedSender<Returned>>,
    queued: Option<mpsc::UnboundedReceiver<Returned>>,
    task: Option<JoinHandle<()>>,
    /// Gives slots back once the first lease is held: a fleet with no
    /// capped seller runs no task for it.
    give_back: Option<StartGiveBack>,
}

impl FleetSlots {
    pub(super) fn new() -> FleetSlots {
        let (back, queued) = mpsc::unbounded_channel();
        FleetSlots {
            back: Some(back),
            queued: Some(queued),
            task: None,
            give_back: None,
        }
    }

    /// Readies the task that gives slots back (on the engine's runtime),
    /// started with the first lease.
    pub(super) fn start<P: Permits>(&mut self, permits: Arc<P>) {
        self.give_back = Some(Box::new(move |queued| {
            tokio::spawn(give_back(permits, queued))
        }));
    }

    /// A grant's leases, held from now on until `lapses_at` at the latest.
    pub(super) fn hold(
        &mut self,
        seller: &Arc<str>,
        leases: Vec<String>,
        lapses_at: Instant,
    ) -> Vec<Lease> {
        if leases.is_empty() {
            return Vec::new();
        }
        if let (Some(spawn), Some(queued)) = (self.give_back.take(), self.queued.take()) {
            self.task = Some(spawn(queued));
        }
        let Some(back) = &self.back else {
            return Vec::new();
        };
        leases
            .into_iter()
            .map(|id| Lease {
                seller: seller.clone(),
                id,
                back: back.clone(),
                lapses_at,
            })
            .collect()
    }

    /// Shutdown: waits (briefly) until the slots of dropped leases are
    /// back. Leases still held elsewhere lapse.
    pub(super) async fn finish(&mut self) {
        self.back = None;
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(FINAL_RETURN_TIMEOUT, task).await;
        }
    }
}

/// Gives queued slots back, each seller's together, until every sender is
/// gone. A failed return is told once per batch: the slots lapse.
async fn give_back<P: Permits>(permits: Arc<P>, mut queued: mpsc::UnboundedReceiver<Returned>) {
    while let Some(first) = queued.recv().await {
        let mut by_seller: BTreeMap<Arc<str>, Vec<String>> = BTreeMap::new();
        by_seller.entry(first.0).or_default().push(first.1);
        while let Ok((seller, id)) = queued.try_recv() {
            by_seller.entry(seller).or_default().push(id);
        }
        let calls = by_seller.iter().map(|(seller, leases)| {
            let permits = &permits;
            async move { (seller, leases.len(), permits.release(seller, leases).await) }
        });
        for (seller, n, result) in futures::future::join_all(calls).await {
            if let Err(e) = result {
                SlotsNotReturned {
                    seller,
                    slots: n,
                    error: &e.to_string(),
                }
                .emit();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::limiter::Decision;
    use crate::worker::PermitError;

    /// A limiter that records what was given back, seller by seller.
    #[derive(Default)]
    struct Returns(Mutex<Vec<(String, Vec<String>)>>);

    impl Permits for Returns {
        async fn acquire(&self, _: &str, _: u64) -> Result<Decision, PermitError> {
            Err(PermitError::Unsupported("not asked here".to_owned()))
        }

        async fn block(
            &self,
            _: &str,
            _: Duration,
            _: Option<u64>,
        ) -> Result<Option<crate::limiter::Learnt>, PermitError> {
            Ok(None)
        }

        async fn release(&self, seller: &str, leases: &[String]) -> Result<(), PermitError> {
            let mut returns = self.0.lock().unwrap();
            returns.push((seller.to_owned(), leases.to_vec()));
            Ok(())
        }
    }

    fn ids(n: usize, seller: &str) -> Vec<String> {
        (0..n).map(|i| format!("{seller}-{i}")).collect()
    }

    // Paused time: `finish` waits out its timeout for the lease still held.
    #[tokio::test(start_paused = true)]
    async fn every_dropped_lease_goes_back_and_the_held_ones_lapse() {
        let permits = Arc::new(Returns::default());
        let mut slots = FleetSlots::new();
        slots.start(permits.clone());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let now = Instant::now();
        let held_a = slots.hold(&a, ids(3, "a"), now);
        let mut held_b = slots.hold(&b, ids(2, "b"), now);
        assert_eq!((held_a.len(), held_b.len()), (3, 2));
        assert!(slots.hold(&a, Vec::new(), now).is_empty());
        // a's three go back (each seller's together, in as few calls as
        // the task finds them queued); one of b's is still held at the end.
        drop(held_a);
        drop(held_b.pop());
        slots.finish().await;
        let returns = permits.0.lock().unwrap();
        let mut back: Vec<(String, String)> = returns
            .iter()
            .flat_map(|(s, ids)| ids.iter().map(move |id| (s.clone(), id.clone())))
            .collect();
        back.sort();
        let expected: Vec<(String, String)> = ["a-0", "a-1", "a-2", "b-1"]
            .iter()
            .map(|id| (id[..1].to_owned(), (*id).to_owned()))
            .collect();
        assert_eq!(back, expected);
        assert!(returns.iter().all(|(_, ids)| !ids.is_empty()));
        drop(held_b);
    }

    /// Issue 53: a lease is trusted only while a call starting now would
    /// end before the slot may lapse (Redis may hand it to another call
    /// then). Rows: (call starts at, call timeout, deferred by, covered),
    /// with the slot lapsing at 30 s.
    #[test]
    fn a_lease_covers_a_call_only_if_it_ends_before_the_slot_may_lapse() {
        const S: Duration = Duration::from_secs(1);
        let rows = [
            (0, 10, 0, true),
            (20, 10, 0, true),
            (21, 10, 0, false),
            // A stall: the answer came 40 s after the ask.
            (40, 10, 0, false),
            (29, 0, 0, true),
            (31, 0, 0, false),
            // A pacer's job going 15 s after the grant holds its slot
            // 15 s longer.
            (35, 10, 15, true),
            (36, 10, 15, false),
        ];
        let mut slots = FleetSlots::new();
        let t0 = Instant::now();
        for (i, (at, call, deferred, covered)) in rows.into_iter().enumerate() {
            let mut lease = slots
                .hold(&Arc::from("s"), ids(1, "s"), t0 + 30 * S)
                .pop()
                .expect("one lease");
            lease.defer(deferred * S);
            assert_eq!(
                lease.covers(t0 + at * S, call * S),
                covered,
                "row {i}: call at {at}s for up to {call}s, deferred {deferred}s"
            );
        }
    }

    #[tokio::test]
    async fn a_fleet_with_no_capped_seller_runs_no_task() {
        let permits = Arc::new(Returns::default());
        let mut slots = FleetSlots::new();
        slots.start(permits.clone());
        assert!(slots
            .hold(&Arc::from("a"), Vec::new(), Instant::now())
            .is_empty());
        assert!(slots.task.is_none(), "no lease held, no task");
        slots.finish().await;
        assert!(permits.0.lock().unwrap().is_empty());
    }
}
