//! Sellers' queues, the downstream slot pool and capacity turns.
//!
//! A seller is in one phase at a time: idle, asking the limiter, or running
//! a granted batch. It asks only for as many jobs as there are free
//! downstream slots, one per partition head, so a grant is used at once: a
//! grant that waited for capacity would reach the downstream late and bunch
//! up with the next window's. Sellers that are ready while every slot is
//! taken wait in turn, without asking Redis. A pacer's granted jobs wait
//! for their go-at without a slot, and take one when they can go.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

use crate::kafka::consumer::Origin;
use crate::limiter::BatchGranted;
use crate::telemetry::events::{CallAvoided, LimiterCalled, SellerWaiting};

use super::engine::{Engine, Event, Pending};
use super::ports::{Clock, Permits, Ports};
use super::timers::Timer;

/// The most units one limiter call asks for.
pub(super) const MAX_BATCH: usize = 64;

/// How deep into a seller's queue to look for the next job of each
/// partition; bounds the work per limiter call for a seller with a deep
/// backlog on few partitions.
const HEAD_SCAN: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Asking,
    Running,
}

/// One seller's jobs on this replica.
#[derive(Debug)]
pub(super) struct Seller {
    /// Waiting for a permit, in arrival order.
    pub(super) queue: VecDeque<Pending>,
    /// Failed calls waiting out their backoff.
    pub(super) delayed: Vec<(Instant, Pending)>,
    pub(super) phase: Phase,
    /// Refused (by the limiter, a 429 or the failure policy) until then.
    pub(super) blocked_until: Option<Instant>,
    /// Downstream slots held for the limiter call under way or the run.
    pub(super) reserved: usize,
    /// In the capacity queue: ready to ask, but every slot is taken.
    pub(super) wants_capacity: bool,
    /// The jobs the limiter call under way asks about, in order. The answer
    /// is read against these, not against the queue, which may change
    /// meanwhile (a revoke, `unstick`): a "never" names the job it was
    /// about, and a grant takes only jobs that were asked for.
    pub(super) asked: Vec<Origin>,
    /// 429s in a row that named no useful wait (none, zero, a past date):
    /// each one backs off longer, so "Retry-After: 0" cannot loop.
    pub(super) throttles_in_a_row: u32,
    /// A pacer's granted jobs waiting for the instant their unit may go,
    /// earliest first. They hold no downstream slot while they wait.
    pub(super) paced: VecDeque<Paced>,
    /// Runs under way (a granted batch, or one paced job each).
    pub(super) runs: usize,
    /// In the paced queue: a paced job is due, but every slot is taken.
    pub(super) wants_paced_slot: bool,
    /// Held by an operator's pause since then (`None`: not paused, as far
    /// as the last look went).
    pub(super) paused_since: Option<Instant>,
    /// Its last hold is for a slot of its `max_in_flight` (every slot
    /// taken, fleet-wide): it waits for capacity, not for its limit.
    pub(super) in_flight_bound: bool,
}

/// A granted job of a pacer (`leaky_bucket`), waiting for its go-at.
#[derive(Debug)]
pub(super) struct Paced {
    pub(super) go_at: Instant,
    /// Its unit's go-at on the limiter's clock (µs): its `X-Granted-At`.
    pub(super) granted_at_us: u64,
    pub(super) pending: Pending,
}

impl Seller {
    fn new() -> Seller {
        Seller {
            queue: VecDeque::new(),
            delayed: Vec::new(),
            phase: Phase::Idle,
            blocked_until: None,
            reserved: 0,
            wants_capacity: false,
            asked: Vec::new(),
            throttles_in_a_row: 0,
            paced: VecDeque::new(),
            runs: 0,
            wants_paced_slot: false,
            paused_since: None,
            in_flight_bound: false,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
            && self.delayed.is_empty()
            && self.paced.is_empty()
            && self.runs == 0
            && self.phase == Phase::Idle
            && !self.wants_capacity
    }

    /// Running while a run is under way or a paced job waits; idle after.
    /// A limiter call under way keeps its seller asking: its answer holds
    /// the slots it reserved.
    pub(super) fn settle_phase(&mut self) {
        if self.phase == Phase::Asking {
            return;
        }
        self.phase = if self.runs > 0 || !self.paced.is_empty() {
            Phase::Running
        } else {
            Phase::Idle
        };
    }
}

/// Every seller with work here, and the downstream slots.
#[derive(Debug)]
pub(super) struct Sellers {
    /// Ordered, so that every walk over the sellers is the same for the
    /// same history (the simulation replays a seed exactly).
    pub(super) map: BTreeMap<Arc<str>, Seller>,
    /// Downstream slots (of `downstream.concurrency`) not reserved.
    pub(super) slots_free: usize,
    /// Sellers ready to ask but waiting for a slot, served in turn.
    capacity_waiters: VecDeque<Arc<str>>,
    /// Sellers with a paced job due but no slot: served before any seller
    /// asks, since their units are spent already.
    pub(super) paced_waiters: VecDeque<Arc<str>>,
}

impl Sellers {
    pub(super) fn new(slots: usize) -> Sellers {
        Sellers {
            map: BTreeMap::new(),
            slots_free: slots,
            capacity_waiters: VecDeque::new(),
            paced_waiters: VecDeque::new(),
        }
    }

    pub(super) fn entry(&mut self, key: &Arc<str>) -> &mut Seller {
        self.map.entry(key.clone()).or_insert_with(Seller::new)
    }

    pub(super) fn get_mut(&mut self, key: &Arc<str>) -> Option<&mut Seller> {
        self.map.get_mut(key)
    }
}

impl<X: Ports> Engine<X> {
    /// A job ready to run: queued behind its seller's others, or sent to the
    /// retry topic when its seller is held for longer than
    /// `worker.max_inline_delay`.
    pub(super) fn enqueue(&mut self, pending: Pending) {
        let now = self.deps.clock.now();
        let max_delay = self.settings.worker.max_inline_delay;
        let key: Arc<str> = Arc::from(pending.job.seller_id.as_str());
        let seller = self.sellers.entry(&key);
        if let Some(until) = seller.blocked_until {
            if until > now {
                // A job that asked for itself would go to Redis here, only
                // to be refused.
                CallAvoided { seller: &key }.emit();
            }
            if until > now + max_delay {
                let wait = until - now;
                return self.defer(pending, wait);
            }
        }
        seller.queue.push_back(pending);
        self.ask_if_ready(&key);
    }

    /// Asks the limiter for a seller that is idle, not held and has work,
    /// when a downstream slot is free; otherwise queues it for a slot.
    pub(super) fn ask_if_ready(&mut self, key: &Arc<str>) {
        let now = self.deps.clock.now();
        let Some(seller) = self.sellers.map.get_mut(key) else {
            return;
        };
        if seller.phase != Phase::Idle {
            return;
        }
        if seller.blocked_until.is_some_and(|t| t > now) {
            return;
        }
        seller.blocked_until = None;
        // Jobs whose backoff is over go first: they are older than the queue.
        let mut due: Vec<Pending> = Vec::new();
        let mut i = 0;
        while i < seller.delayed.len() {
            if seller.delayed[i].0 <= now {
                due.push(seller.delayed.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        // Oldest first: swap_remove scrambled them.
        due.sort_by_key(|p| p.origin.offset);
        for p in due.into_iter().rev() {
            seller.queue.push_front(p);
        }
        if let Some(next) = seller.delayed.iter().map(|(t, _)| *t).min() {
            self.timers.at(next, Timer::Seller(key.clone()));
        }
        let seller = self.sellers.map.get_mut(key).expect("looked up above");
        if seller.queue.is_empty() {
            if seller.is_empty() {
                self.sellers.map.remove(key);
            }
            // Its jobs are gone (revoked, finished): a probe it held goes
            // to the next seller.
            self.outage.probe_dropped(key);
            return;
        }
        // An operator's pause: no ask, no call, until it ends.
        if let Some(pause) = self.pause_of(key) {
            self.outage.probe_dropped(key);
            return self.hold_paused(key, pause);
        }
        let Some(seller) = self.sellers.map.get_mut(key) else {
            return;
        };
        seller.paused_since = None;
        if self.sellers.slots_free == 0 {
            // Capacity-bound: wait for a slot without asking Redis.
            if !seller.wants_capacity {
                SellerWaiting::capacity(key).emit();
                seller.wants_capacity = true;
                self.sellers.capacity_waiters.push_back(key.clone());
            }
            return;
        }
        // During a downstream outage only one probe call goes out at a
        // time. The probe is claimed here, where the limiter is asked at
        // once, and not before the wait for a slot: a seller that waits,
        // is paused or loses its jobs never sits on it.
        let probe = match self.outage.admit(key, now) {
            Ok(probe) => probe,
            Err(until) => {
                self.timers.at(until, Timer::Seller(key.clone()));
                return;
            }
        };
        // The heads in queue order, with their costs: the limiter grants the
        // longest prefix that fits, so a heavy job that does not fit yet
        // stops lighter later ones from taking the units it waits for.
        let most = MAX_BATCH
            .min(self.sellers.slots_free)
            .min(probe.unwrap_or(usize::MAX));
        let heads = partition_heads(&seller.queue, most);
        let costs: Vec<u64> = heads.iter().map(|&i| seller.queue[i].job.cost).collect();
        seller.asked = heads
            .iter()
            .map(|&i| seller.queue[i].origin.clone())
            .collect();
        let n = costs.len();
        seller.reserved = n;
        seller.phase = Phase::Asking;
        self.sellers.slots_free -= n;
        let (permits, tx, clock) = (
            self.deps.permits.clone(),
            self.tx.clone(),
            self.deps.clock.clone(),
        );
        let seller_id = key.clone();
        self.tasks += 1;
        LimiterCalled.emit();
        tokio::spawn(async move {
            let result = permits.acquire_jobs(&seller_id, &costs).await;
            let _ = tx.send(Event::Permit {
                seller: seller_id,
                result,
                answered_at: clock.now(),
            });
        });
    }

    /// Gives `n` downstream slots back: to paced jobs that are due first
    /// (granted already), then to waiting sellers' asks, in turn.
    pub(super) fn release(&mut self, n: usize) {
        self.sellers.slots_free += n;
        while self.sellers.slots_free > 0 {
            let Some(key) = self.sellers.paced_waiters.pop_front() else {
                break;
            };
            if let Some(seller) = self.sellers.map.get_mut(&key) {
                seller.wants_paced_slot = false;
            }
            self.call_paced(&key);
        }
        while self.sellers.slots_free > 0 {
            let Some(key) = self.sellers.capacity_waiters.pop_front() else {
                break;
            };
            if let Some(seller) = self.sellers.map.get_mut(&key) {
                seller.wants_capacity = false;
            }
            self.ask_if_ready(&key);
        }
    }
}

/// Indexes (ascending) of the first waiting job of each partition, at most
/// `max` of them. A seller asks the limiter for exactly these: each can be
/// called the moment it is granted (the jobs behind it in its partition
/// must wait for it, to keep their order), so a grant reaches the downstream
/// within one call of being made, and the downstream's view of the rate is
/// the limiter's.
pub(super) fn partition_heads(queue: &VecDeque<Pending>, max: usize) -> Vec<usize> {
    let mut seen: Vec<(&str, i32)> = Vec::new();
    let mut heads = Vec::new();
    for (i, p) in queue.iter().take(HEAD_SCAN).enumerate() {
        if heads.len() == max {
            break;
        }
        let part = (&*p.origin.topic, p.origin.partition);
        if !seen.contains(&part) {
            seen.push(part);
            heads.push(i);
        }
    }
    heads
}

/// Where the job at `origin` waits in `queue`, looking no deeper than
/// the heads a seller asks about can be.
pub(super) fn position(queue: &VecDeque<Pending>, origin: &Origin) -> Option<usize> {
    queue
        .iter()
        .take(HEAD_SCAN)
        .position(|p| p.origin == *origin)
}

/// Removes and returns the granted jobs, in the order asked, each with
/// its place in `asked`: the first `g.jobs` of `asked` that still wait (a
/// revoke or `unstick` between the question and the answer may have taken
/// some; their units go unused), never more units than were charged.
pub(super) fn take_granted(
    queue: &mut VecDeque<Pending>,
    g: &BatchGranted,
    asked: &[Origin],
) -> Vec<(usize, Pending)> {
    let mut units = 0u64;
    let mut out = Vec::new();
    for (k, origin) in asked.iter().take(g.jobs).enumerate() {
        let Some(i) = position(queue, origin) else {
            continue;
        };
        let cost = queue[i].job.cost;
        if units + cost > g.units {
            break;
        }
        units += cost;
        out.extend(queue.remove(i).map(|p| (k, p)));
    }
    out
}
