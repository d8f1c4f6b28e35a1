//! The turns at the downstream slots: the slot pool (`super::pool`), whose
//! turn is next when a slot frees (weighted fair shares, `super::fair`),
//! the seller whose turn it is, and the sellers whose paced jobs wait for a
//! slot. It knows sellers by key only: what each holds and whether it asks
//! for more, the scheduler tells it when it asks whose turn is next.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::limiter::Share;

use super::fair::Fair;
use super::pool::{SlotPool, Slots};

/// Whose turn it is when a slot is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Turn {
    /// A pacer's due job, granted already.
    Paced(Arc<str>),
    /// A seller that waits to ask.
    Ask(Arc<str>),
}

/// The slots and the turns at them.
#[derive(Debug)]
pub(super) struct Turns {
    pool: SlotPool,
    /// Sellers ready to ask but waiting for a slot, and whose turn is
    /// next: weighted fair shares.
    fair: Fair,
    /// The seller [`Turns::next`] named last: it asks without joining the
    /// turns again.
    turn: Option<Arc<str>>,
    /// Sellers with a paced job due but no slot, each once.
    paced_waiters: VecDeque<Arc<str>>,
}

impl Turns {
    /// Up to `limit` slots taken at once, `ceiling` at most when the
    /// limit is raised.
    pub(super) fn new(ceiling: usize, limit: usize) -> Turns {
        Turns {
            pool: SlotPool::new(ceiling, limit),
            fair: Fair::new(limit),
            turn: None,
            paced_waiters: VecDeque::new(),
        }
    }

    /// Slots held by calls out or about to go out.
    pub(super) fn in_flight(&self) -> usize {
        self.pool.taken()
    }

    /// How many calls may be out at once from now (the adaptive limit).
    pub(super) fn set_concurrency(&mut self, limit: usize) {
        self.pool.set_limit(limit);
        self.fair.resize(limit);
    }

    pub(super) fn concurrency(&self) -> usize {
        self.pool.limit()
    }

    /// Whether `key` must wait for a slot: every slot is taken, or others
    /// wait for one and this is not `key`'s turn (its turn is used up
    /// here), or `queue_only`.
    pub(super) fn must_wait(&mut self, key: &Arc<str>, queue_only: bool) -> bool {
        let has_turn = self.turn.as_ref() == Some(key);
        if has_turn {
            self.turn = None;
        }
        let full = self.pool.free() == 0;
        full || queue_only || (!has_turn && self.fair.others_wait(key))
    }

    /// `key` joins the turns with its `share` (see [`Fair::join`]).
    pub(super) fn join(&mut self, key: &Arc<str>, share: Share, away: bool) {
        self.fair.join(key, share, away);
    }

    /// How many jobs `key` may ask for now: one per free slot, its fair
    /// allowance of them, and at most `max`.
    pub(super) fn most(&self, key: &Arc<str>, max: usize) -> usize {
        let free = self.pool.free();
        max.min(free).min(self.fair.allowance(key, free))
    }

    /// `key` asks the limiter for jobs of these `costs`: charged to its
    /// share until the answer, and a slot each, held until then.
    pub(super) fn asked(&mut self, key: &Arc<str>, share: Share, costs: &[u64]) -> Slots {
        self.fair.asked(key, share, costs.iter().sum());
        let slots = self.pool.take_up_to(costs.len());
        debug_assert_eq!(slots.len(), costs.len(), "asked for more than is free");
        slots
    }

    /// `key`'s limiter call answered: what it asked for is refunded.
    pub(super) fn answered(&mut self, key: &Arc<str>) {
        self.fair.answered(key);
    }

    /// `key` was granted jobs of these `units`: they use slots.
    pub(super) fn charge(&mut self, key: &Arc<str>, units: u64) {
        self.fair.charge(key, units);
    }

    /// A slot for a paced job of `key`; with none free, `key` waits in
    /// line for the next (unless `in_line` says it does already).
    pub(super) fn paced_slot(&mut self, key: &Arc<str>, in_line: bool) -> Option<Slots> {
        let slot = self.pool.take_one();
        if slot.is_none() && !in_line {
            self.paced_waiters.push_back(key.clone());
        }
        slot
    }

    /// Whose turn it is while a slot is free: due paced jobs first, then
    /// sellers waiting to ask, by their fair shares (`held` and
    /// `asking_for_more` as [`Fair::next`] reads them).
    pub(super) fn next(
        &mut self,
        held: &dyn Fn(&str) -> usize,
        asking_for_more: &dyn Fn(&str) -> bool,
    ) -> Option<Turn> {
        if self.pool.free() == 0 {
            return None;
        }
        if let Some(key) = self.paced_waiters.pop_front() {
            return Some(Turn::Paced(key));
        }
        let key = self.fair.next(held, asking_for_more)?;
        self.turn = Some(key.clone());
        Some(Turn::Ask(key))
    }

    /// `key` has nothing here any more (see [`Fair::forget`]).
    pub(super) fn forget(&mut self, key: &Arc<str>) {
        self.fair.forget(key);
    }

    /// Shutdown's end: every account closed, no one in line.
    pub(super) fn clear(&mut self) {
        self.fair.clear();
        self.turn = None;
        self.paced_waiters.clear();
    }
}
