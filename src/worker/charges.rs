//! Units a grant charged to its seller's rules, held by the granted jobs
//! until their calls start. A grant's units are charged in the store when
//! it is decided; each job it granted holds its own as a [`Charge`], spent
//! as its call starts. A charge dropped unspent gives its units back
//! ([`Permits::give_back`]), wherever that happens: a revoke that takes
//! the job's partition before its call (waiting for its go-at, in a run
//! not yet started, granted after its partition went), a shutdown that
//! leaves it uncalled, a grant whose jobs were gone before it came. The
//! next owner asks for those jobs again, and finds the seller charged once
//! for each call, not once per owner.
//!
//! Dropping only queues the units; one task gives them back, per grant in
//! one call, off the engine's loop. A replica that dies gives nothing
//! back: its units stay charged until the rules drain them, as before.
//!
//! A pacer (`leaky_bucket`) can take back only the end of its queue: a
//! grant's units are its slots in time, and a slot given back before one
//! still used is a hole no later grant may fill (the queue is one instant,
//! not a list of slots). So each charge knows where its units sit in its
//! grant, and the grant tracks how many of its last units have all come
//! back: only those are given back to a pacer ([`Unused::at_tail`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use std::sync::Mutex;

use crate::limiter::{BatchGranted, Receipt, Unused};
use crate::telemetry::events::UnitsGivenBack;

use super::ports::Permits;

/// How long shutdown waits for the last units to go back.
const FINAL_RETURN_TIMEOUT: Duration = Duration::from_secs(2);

/// A charge's units on their way back: its seller, its grant, how many
/// (and how many of those now end the grant).
pub(super) type Returned = (Arc<str>, Arc<Receipt>, Unused);

/// Starts the task that gives units back, given the queue it reads.
type StartGiveBack = Box<dyn FnOnce(mpsc::UnboundedReceiver<Returned>) -> JoinHandle<()> + Send>;

/// One grant's charged units, shared by the charges split from it.
struct Grant {
    seller: Arc<str>,
    receipt: Arc<Receipt>,
    /// Where the grant's unbroken run of returned units begins: every unit
    /// from here to its end has come back, and the ranges returned before
    /// it (start → end), which join the run once everything after them has.
    tail: Mutex<(u64, BTreeMap<u64, u64>)>,
}

impl Grant {
    /// Units `start..end` come back: how many units join the grant's
    /// returned end with them (theirs, and any returned earlier that were
    /// waiting on them), 0 while a unit after them is used or still held.
    fn returned(&self, start: u64, end: u64) -> u64 {
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let (from, waiting) = &mut *tail;
        waiting.insert(start, end);
        let before = *from;
        // A range returned twice would break the count: a charge returns
        // its units once, on drop, and ranges never overlap.
        while let Some((&s, &e)) = waiting.range(..*from).next_back() {
            if e != *from {
                break;
            }
            waiting.remove(&s);
            *from = s;
        }
        before - *from
    }
}

/// Units of one grant, held unspent; given back when dropped unspent.
pub struct Charge {
    grant: Arc<Grant>,
    /// Where its units begin in its grant: a pacer's grant runs its units
    /// in this order, first to last.
    start: u64,
    /// Units still unspent: 0 once spent (then nothing goes back).
    units: u64,
    back: mpsc::UnboundedSender<Returned>,
}

impl Charge {
    /// The next `n` of its units (all it holds, at most) as a charge of
    /// their own: one granted job's, split in the order the jobs use the
    /// grant. `None` when it holds none.
    pub(super) fn split(&mut self, n: u64) -> Option<Charge> {
        let n = n.min(self.units);
        if n == 0 {
            return None;
        }
        let start = self.start;
        self.start += n;
        self.units -= n;
        Some(Charge {
            grant: self.grant.clone(),
            start,
            units: n,
            back: self.back.clone(),
        })
    }

    /// Its job's call starts: the units are used, none goes back.
    pub(super) fn spend(mut self) {
        self.units = 0;
    }

    /// Units it would give back if dropped now.
    #[cfg(test)]
    pub(super) fn units(&self) -> u64 {
        self.units
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Charge")
            .field(&self.grant.receipt.call_id)
            .field(&self.start)
            .field(&self.units)
            .finish()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.units == 0 {
            return;
        }
        let at_tail = self.grant.returned(self.start, self.start + self.units);
        let unused = Unused {
            units: self.units,
            at_tail,
        };
        // The task is gone only at the very end of shutdown: the units
        // stay charged then, as they did before charges went back.
        let _ = self.back.send((
            self.grant.seller.clone(),
            self.grant.receipt.clone(),
            unused,
        ));
    }
}

/// The engine's side of the charges.
pub(super) struct FleetCharges {
    back: Option<mpsc::UnboundedSender<Returned>>,
    queued: Option<mpsc::UnboundedReceiver<Returned>>,
    task: Option<JoinHandle<()>>,
    /// Gives units back once the first charge is held: a fleet whose
    /// limiter names no receipts runs no task for it.
    give_back: Option<StartGiveBack>,
}

impl FleetCharges {
    pub(super) fn new() -> FleetCharges {
        let (back, queued) = mpsc::unbounded_channel();
        FleetCharges {
            back: Some(back),
            queued: Some(queued),
            task: None,
            give_back: None,
        }
    }

    /// Readies the task that gives units back (on the engine's runtime),
    /// started with the first charge.
    pub(super) fn start<P: Permits>(&mut self, permits: Arc<P>) {
        self.give_back = Some(Box::new(move |queued| {
            tokio::spawn(give_back(permits, queued))
        }));
    }

    /// The units `grant` charged, held from now on (taking its receipt):
    /// `None` when no store charged them.
    pub(super) fn hold(&mut self, seller: &Arc<str>, grant: &mut BatchGranted) -> Option<Charge> {
        let receipt = grant.receipt.take()?;
        if grant.units == 0 {
            return None;
        }
        if let (Some(spawn), Some(queued)) = (self.give_back.take(), self.queued.take()) {
            self.task = Some(spawn(queued));
        }
        let back = self.back.as_ref()?.clone();
        Some(Charge {
            grant: Arc::new(Grant {
                seller: seller.clone(),
                receipt: Arc::new(receipt),
                tail: Mutex::new((grant.units, BTreeMap::new())),
            }),
            start: 0,
            units: grant.units,
            back,
        })
    }

    /// The queue of units on their way back, for a test to read instead
    /// of the task.
    #[cfg(test)]
    pub(super) fn take_queue(&mut self) -> mpsc::UnboundedReceiver<Returned> {
        self.queued.take().expect("the queue is read once")
    }

    /// Shutdown: waits (briefly) until the units of dropped charges are
    /// back. Charges still held elsewhere stay charged.
    pub(super) async fn finish(&mut self) {
        self.back = None;
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(FINAL_RETURN_TIMEOUT, task).await;
        }
    }
}

/// Gives queued units back, each grant's together, until every sender is
/// gone. A failed give-back is told: those units stay charged until the
/// rules drain them.
async fn give_back<P: Permits>(permits: Arc<P>, mut queued: mpsc::UnboundedReceiver<Returned>) {
    while let Some(first) = queued.recv().await {
        // Keyed by seller and call id: one refund per grant.
        let mut by_grant: BTreeMap<(Arc<str>, String), (Arc<Receipt>, Unused)> = BTreeMap::new();
        let mut add = |(seller, receipt, unused): Returned| {
            let sum = &mut by_grant
                .entry((seller, receipt.call_id.clone()))
                .or_insert((receipt, Unused::default()))
                .1;
            sum.units += unused.units;
            sum.at_tail += unused.at_tail;
        };
        add(first);
        while let Ok(more) = queued.try_recv() {
            add(more);
        }
        let calls = by_grant.iter().map(|((seller, _), (receipt, unused))| {
            let permits = &permits;
            async move {
                let result = permits.give_back(seller, receipt, *unused).await;
                (seller, unused.units, result)
            }
        });
        for (seller, units, result) in futures::future::join_all(calls).await {
            let error = result.err().map(|e| e.to_string());
            UnitsGivenBack {
                seller,
                units,
                error: error.as_deref(),
            }
            .emit();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::limiter::local::granted;
    use crate::limiter::Decision;
    use crate::worker::PermitError;

    /// A limiter that records what was given back: (seller, call id,
    /// units), in the order asked.
    #[derive(Default)]
    struct GivenBack(Mutex<Vec<(String, String, u64)>>);

    impl Permits for GivenBack {
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

        async fn give_back(
            &self,
            seller: &str,
            receipt: &Receipt,
            unused: Unused,
        ) -> Result<(), PermitError> {
            let mut back = self.0.lock().unwrap();
            back.push((seller.to_owned(), receipt.call_id.clone(), unused.units));
            Ok(())
        }
    }

    /// A grant of `units` charged by call `id`.
    fn charged(id: &str, units: u64) -> BatchGranted {
        BatchGranted {
            receipt: Some(Receipt {
                call_id: id.to_owned(),
                taken_at_us: 1,
            }),
            ..granted(units as usize, units)
        }
    }

    // Paused time: `finish` waits out its timeout while a charge is held.
    #[tokio::test(start_paused = true)]
    async fn units_dropped_unspent_go_back_per_grant_and_spent_ones_do_not() {
        let permits = Arc::new(GivenBack::default());
        let mut charges = FleetCharges::new();
        charges.start(permits.clone());
        let s: Arc<str> = "s".into();
        let mut a = charges.hold(&s, &mut charged("a", 5)).expect("charged");
        let mut b = charges.hold(&s, &mut charged("b", 2)).expect("charged");
        // Grant a: jobs of 1, 2 and 1 units; the first is called, the
        // others are stranded; the fifth unit's job was gone before the
        // grant came (the rest of `a`).
        let (one, two, three) = (a.split(1), a.split(2), a.split(1));
        one.expect("1 unit").spend();
        drop((two, three, a));
        // Grant b: one job called, one still held at the end.
        b.split(1).expect("1 unit").spend();
        let held = b.split(1).expect("1 unit");
        assert_eq!(b.units(), 0);
        assert!(b.split(1).is_none(), "nothing left to split");
        drop(b);
        charges.finish().await;
        let back = permits.0.lock().unwrap().clone();
        let total: u64 = back
            .iter()
            .filter(|(_, id, _)| id == "a")
            .map(|(_, _, u)| u)
            .sum();
        assert_eq!(total, 4, "a's unspent units, and only those: {back:?}");
        assert!(
            back.iter().all(|(s, id, _)| s == "s" && id == "a"),
            "b's spent unit and the one still held do not go back: {back:?}"
        );
        assert_eq!(held.units(), 1);
    }

    /// A pacer takes back only the units that end a grant: a unit given
    /// back before one still held waits for it, and one before a unit
    /// spent never ends the grant. Rows: a grant of four one-unit jobs,
    /// what happens to each in turn, and the units at the tail each drop
    /// sends.
    #[test]
    fn units_end_the_grant_only_once_every_unit_after_them_is_back() {
        // (job, spent?) in the order they leave; the tails sent.
        type Row = (&'static [(usize, bool)], &'static [u64]);
        let rows: [Row; 4] = [
            // Last to first: each ends the grant in turn.
            (
                &[(3, false), (2, false), (1, false), (0, false)],
                &[1, 1, 1, 1],
            ),
            // First to last: nothing ends it until the last, then all.
            (
                &[(0, false), (1, false), (2, false), (3, false)],
                &[0, 0, 0, 4],
            ),
            // The last one is called: nothing before it can end the grant.
            (&[(3, true), (0, false), (2, false), (1, false)], &[0, 0, 0]),
            // A hole, then its neighbour after it, then the end.
            (&[(1, false), (2, true), (3, false), (0, false)], &[0, 1, 0]),
        ];
        for (steps, want) in rows {
            let mut charges = FleetCharges::new();
            let mut queue = charges.take_queue();
            let mut all = charges
                .hold(&"s".into(), &mut charged("a", 4))
                .expect("charged");
            let mut jobs: Vec<Option<Charge>> = (0..4).map(|_| all.split(1)).collect();
            drop(all);
            let mut tails = Vec::new();
            for &(job, spent) in steps {
                let charge = jobs[job].take().expect("each job leaves once");
                if spent {
                    charge.spend();
                } else {
                    drop(charge);
                    let (_, _, unused) = queue.try_recv().expect("dropped unspent");
                    assert_eq!(unused.units, 1);
                    tails.push(unused.at_tail);
                }
            }
            assert_eq!(tails, want, "{steps:?}");
        }
    }

    #[tokio::test]
    async fn a_grant_no_store_charged_holds_no_charge_and_runs_no_task() {
        let permits = Arc::new(GivenBack::default());
        let mut charges = FleetCharges::new();
        charges.start(permits.clone());
        assert!(charges.hold(&"s".into(), &mut granted(2, 2)).is_none());
        assert!(charges.task.is_none(), "no charge held, no task");
        charges.finish().await;
        assert!(permits.0.lock().unwrap().is_empty());
    }
}
