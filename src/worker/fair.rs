//! Weighted fair shares of the downstream slots: who gets the next free
//! slot when more sellers are ready than slots are free. It does no I/O
//! and reads no clock: the scheduler tells it who waits, what each asked
//! for and what each used, and asks it whose turn it is.
//!
//! Each seller has a *virtual time*: the cost units it was served, over
//! its weight (`limits.weight`). The next free slot goes to the waiting
//! seller whose virtual time is lowest, so over any stretch in which they
//! all wait, sellers are served units in proportion to their weights: this
//! is deficit round robin in its virtual-time form (start-time fair
//! queuing), which stays exact when a seller is briefly not in the turns
//! (its limiter call is under way, its partitions are all busy) where a
//! round pointer would skip it and lose its deficit.
//! - **Costs count.** A seller is charged the cost of each job it asks
//!   for when it asks (so one free slot after another does not all go to
//!   it before its answer), and refunded what the limiter did not grant:
//!   in the end a job is charged when its slot is used.
//! - **Work-conserving.** Only sellers in the turns take part: a share a
//!   seller does not use goes to the others, and a seller that was away
//!   comes back at the others' virtual time with at most one pool of
//!   credit ([`Fair::join`]), so idleness is never saved up for a burst.
//! - **Guarantees first.** A seller holding fewer slots than its
//!   `min_share` guarantees takes the next free slot before weights are
//!   looked at (lowest virtual time first among those).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::limiter::Share;

/// Virtual time per cost unit of a weight-1 seller: divisible by every
/// weight up to 16, so common weights charge exactly.
const SCALE: u64 = 720_720;

/// Pools of units a seller with jobs out may be owed at most: a bound on
/// the burst it takes when it can use more slots again (more partitions).
const ACTIVE_POOLS: u64 = 8;

/// How far behind (in units of the next seller's) a seller in the middle
/// of its limiter call must be for a freed slot to wait for its answer.
const HOLD_MARGIN_UNITS: u64 = 1;

/// A turn's quantum is the pool over this many units (weight 1), so that
/// one turn takes at most about a quarter of the slots ahead of its fair
/// place, times its weight ([`Fair::allowance`]).
const QUANTUM_OF_POOL: usize = 4;

/// One seller's place in the shares.
#[derive(Debug, Clone)]
struct Account {
    share: Share,
    /// Cost units served over weight, × [`SCALE`]; never behind the
    /// fleet's [`Fair::virtual_now`] by more than one pool of units.
    vtime: u64,
    /// Units charged for the limiter call under way, refunded in part
    /// when it answers.
    asked: u64,
    /// The virtual time that charge added, given back exactly when the
    /// call answers (not recomputed from `share`, which a reload may
    /// change in between): so `vtime >= charged` always holds, since
    /// nothing else takes virtual time back.
    charged: u64,
    /// In the turns since then (a sequence number: ties go to the
    /// longest waiting).
    waiting_since: Option<u64>,
}

/// The turns at the downstream slots. Every operation is logarithmic in
/// the sellers here, or linear in the few it must look at (those with a
/// `min_share`, those with a limiter call under way): a replica with
/// thousands of sellers pays for each turn what one with three does.
#[derive(Debug)]
pub(super) struct Fair {
    /// Every seller with work here. Ordered, so that a seed replays.
    accounts: BTreeMap<Arc<str>, Account>,
    /// The sellers in the turns, by (virtual time, waiting since): the
    /// next turn is the first. Always the accounts whose `waiting_since`
    /// is set, with their current `vtime`.
    waiting: BTreeSet<(u64, u64, Arc<str>)>,
    /// The waiting sellers whose share guarantees slots (`min_share`).
    guaranteed: BTreeSet<Arc<str>>,
    /// The sellers with a limiter call under way (`asked > 0`).
    asking: BTreeSet<Arc<str>>,
    /// The virtual time of the last seller served: a seller that joins
    /// starts no earlier than this less one pool.
    virtual_now: u64,
    /// Joins so far (orders ties).
    joins: u64,
    /// Slots in the pool (`downstream.concurrency`, or the adaptive
    /// limit now).
    size: usize,
}

impl Fair {
    pub(super) fn new(size: usize) -> Fair {
        Fair {
            accounts: BTreeMap::new(),
            waiting: BTreeSet::new(),
            guaranteed: BTreeSet::new(),
            asking: BTreeSet::new(),
            virtual_now: 0,
            joins: 0,
            size,
        }
    }

    /// The pool's size now (the adaptive concurrency limit moved): the
    /// guarantees and the credit bounds are in its slots.
    pub(super) fn resize(&mut self, size: usize) {
        self.size = size;
    }

    /// Slots `share` guarantees: its `min_share` of the pool, rounded
    /// down, but at least one when the share is above 0.
    pub(super) fn guaranteed(&self, share: Share) -> usize {
        if share.min_share <= 0.0 {
            return 0;
        }
        // A fraction below 1 of a pool: fits, and the cast truncates on
        // purpose (rounds down).
        ((share.min_share * self.size as f64) as usize).max(1)
    }

    /// Sets `key`'s virtual time, keeping its place in the turns in step.
    fn set_vtime(&mut self, key: &Arc<str>, vtime: u64) {
        let Some(a) = self.accounts.get_mut(key) else {
            return;
        };
        if let Some(since) = a.waiting_since {
            let was = self.waiting.remove(&(a.vtime, since, key.clone()));
            debug_assert!(was, "{key} waits but was not in the turns");
            self.waiting.insert((vtime, since, key.clone()));
        }
        a.vtime = vtime;
    }

    /// The account of `key`, opened at the fleet's virtual time.
    fn open(&mut self, key: &Arc<str>, share: Share) -> &mut Account {
        let now = self.virtual_now;
        self.accounts.entry(key.clone()).or_insert(Account {
            share,
            vtime: now,
            asked: 0,
            charged: 0,
            waiting_since: None,
        })
    }

    /// `key` waits for a slot, with its share as the config says now (a
    /// reload applies at the next join). A seller new here, or `away`
    /// (nothing of it out: back after a while), starts at most one pool of
    /// units behind the others; one with jobs out keeps up to
    /// [`ACTIVE_POOLS`] pools of what it is owed (the slots lent while its
    /// limiter call was under way, say).
    pub(super) fn join(&mut self, key: &Arc<str>, share: Share, away: bool) {
        let pools = if away { 1 } else { ACTIVE_POOLS };
        let (now, size) = (self.virtual_now, self.size as u64 * pools);
        let a = self.open(key, share);
        a.share = share;
        let credit = size
            .max(1)
            .saturating_mul(SCALE)
            .checked_div(u64::from(share.weight))
            .unwrap_or(0);
        let vtime = a.vtime.max(now.saturating_sub(credit));
        self.set_vtime(key, vtime);
        let Some(a) = self.accounts.get_mut(key) else {
            return;
        };
        if a.waiting_since.is_none() {
            self.joins += 1;
            a.waiting_since = Some(self.joins);
            self.waiting.insert((a.vtime, self.joins, key.clone()));
        }
        if share.min_share > 0.0 {
            self.guaranteed.insert(key.clone());
        } else {
            self.guaranteed.remove(key);
        }
    }

    /// Whether anyone but `key` waits for a slot.
    pub(super) fn others_wait(&self, key: &str) -> bool {
        let mine = self
            .accounts
            .get(key)
            .is_some_and(|a| a.waiting_since.is_some());
        self.waiting.len() > usize::from(mine)
    }

    /// Takes `key` out of the turns.
    fn leave(&mut self, key: &Arc<str>) {
        if let Some(a) = self.accounts.get_mut(key) {
            if let Some(since) = a.waiting_since.take() {
                self.waiting.remove(&(a.vtime, since, key.clone()));
            }
        }
        self.guaranteed.remove(key);
    }

    /// Takes the next seller out of the turns: one below its guaranteed
    /// slots (`held` says how many each holds) first, else the lowest
    /// virtual time; ties to the longest waiting. None when no one waits,
    /// or while a seller owed more than a unit beyond the next one
    /// is in the middle of its limiter call and has more to ask for
    /// (`asking_for_more`): the slot stays free for the moment its answer
    /// comes, instead of going to a seller it is far ahead of (a limiter
    /// call takes a millisecond, a downstream call tens of them). Without
    /// it a seller loses every slot that frees during its own limiter
    /// calls, one at a time each: a seller owed most of the slots would
    /// get far less.
    pub(super) fn next(
        &mut self,
        held: &dyn Fn(&str) -> usize,
        asking_for_more: &dyn Fn(&str) -> bool,
    ) -> Option<Arc<str>> {
        let owed = self
            .guaranteed
            .iter()
            .filter_map(|k| self.accounts.get(k).map(|a| (k, a)))
            .filter(|(k, a)| held(k) < self.guaranteed(a.share))
            .filter_map(|(k, a)| a.waiting_since.map(|since| (a.vtime, since, k.clone())))
            .min();
        let (vtime, _, pick) = match owed.clone() {
            Some(o) => o,
            None => self.waiting.first()?.clone(),
        };
        let share = self.accounts.get(&pick).map(|a| a.share)?;
        // Held only for a seller behind by more than a unit of the next
        // one's: a tie is evened out by the turns to come, and a slot held
        // for it would idle for nothing.
        let margin = charge(HOLD_MARGIN_UNITS, share);
        let ahead = self.asking.iter().any(|k| {
            self.accounts.get(k).is_some_and(|a| {
                a.asked > 0 && a.vtime.saturating_add(margin) < vtime && asking_for_more(k)
            })
        });
        if ahead && owed.is_none() {
            return None;
        }
        self.leave(&pick);
        self.virtual_now = self.virtual_now.max(vtime);
        Some(pick)
    }

    /// How many of `free` slots `key` may ask for now, in cost units (at
    /// least one; all of them when no one else waits): what takes its
    /// virtual time up to the next waiting seller's, plus a quantum of
    /// [`QUANTUM_OF_POOL`]'s share of the pool times its weight. This is
    /// deficit round robin: a turn takes several slots at once, so that
    /// its jobs travel in one limiter ask (a turn of one unit each made
    /// a limiter call per job: issue 49), and each unit taken is charged,
    /// so over any stretch of backlog the weights hold all the same.
    pub(super) fn allowance(&self, key: &str, free: usize) -> usize {
        let Some(mine) = self.accounts.get(key) else {
            return free;
        };
        let lowest = self
            .waiting
            .iter()
            .find(|(_, _, k)| &**k != key)
            .map(|(v, _, _)| *v);
        let Some(lowest) = lowest else {
            return free;
        };
        let quantum = (self.size / QUANTUM_OF_POOL).max(1) as u64;
        let reach = lowest.saturating_add(quantum.saturating_mul(SCALE));
        let units = reach.saturating_sub(mine.vtime) / step(mine.share);
        usize::try_from(units)
            .unwrap_or(usize::MAX)
            .clamp(1, free.max(1))
    }

    /// `key` asks the limiter for jobs of these `units`, in its turn or
    /// with no one else waiting: charged now, refunded by [`Fair::answered`]
    /// when the answer comes.
    pub(super) fn asked(&mut self, key: &Arc<str>, share: Share, units: u64) {
        let a = self.open(key, share);
        debug_assert_eq!(a.asked, 0, "{key} asked twice at once");
        a.share = share;
        a.asked = units;
        let vtime = a.vtime;
        let after = vtime.saturating_add(charge(units, share));
        a.charged = after - vtime;
        self.virtual_now = self.virtual_now.max(vtime);
        self.set_vtime(key, after);
        if units > 0 {
            self.asking.insert(key.clone());
        }
    }

    /// `key`'s limiter call answered: what it asked for is refunded (what
    /// was granted is charged again by [`Fair::charge`]).
    pub(super) fn answered(&mut self, key: &Arc<str>) {
        let Some(a) = self.accounts.get_mut(key) else {
            return;
        };
        debug_assert!(
            a.vtime >= a.charged,
            "{key} refunded {} of virtual time at {}",
            a.charged,
            a.vtime
        );
        let vtime = a.vtime - a.charged;
        a.asked = 0;
        a.charged = 0;
        self.asking.remove(key);
        self.set_vtime(key, vtime);
    }

    /// `key` was granted jobs of these `units`: they use slots.
    pub(super) fn charge(&mut self, key: &Arc<str>, units: u64) {
        if let Some(a) = self.accounts.get(key) {
            let vtime = a.vtime.saturating_add(charge(units, a.share));
            self.set_vtime(key, vtime);
        }
    }

    /// `key` has nothing here any more: out of the turns, its account
    /// closed (it comes back as new).
    pub(super) fn forget(&mut self, key: &Arc<str>) {
        self.leave(key);
        self.asking.remove(key);
        self.accounts.remove(key);
    }

    /// Shutdown: every account closed.
    pub(super) fn clear(&mut self) {
        self.accounts.clear();
        self.waiting.clear();
        self.guaranteed.clear();
        self.asking.clear();
    }
}

/// Virtual time of `units` under `share`.
fn charge(units: u64, share: Share) -> u64 {
    units.saturating_mul(SCALE) / u64::from(share.weight.max(1))
}

/// Virtual time of one unit under `share`.
fn step(share: Share) -> u64 {
    charge(1, share)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    fn share(weight: u32, min_share: f64) -> Share {
        Share { weight, min_share }
    }

    /// Serves `turns` slots among sellers that always wait (each asks for
    /// one unit of `cost` and uses it), and counts units per seller.
    fn serve(sellers: &[(&str, Share, u64)], turns: usize) -> BTreeMap<String, u64> {
        let mut fair = Fair::new(4);
        let mut served = BTreeMap::new();
        for (name, sh, _) in sellers {
            fair.join(&key(name), *sh, true);
        }
        for _ in 0..turns {
            let k = fair.next(&|_| 0, &|_| false).expect("someone waits");
            let (_, sh, cost) = sellers.iter().find(|s| *s.0 == *k).expect("known");
            ask(&mut fair, &k, *sh, *cost, *cost);
            *served.entry(k.to_string()).or_default() += cost;
            fair.join(&k, *sh, true);
        }
        served
    }

    /// `k` asks for `asked` units and is granted `used` of them.
    fn ask(fair: &mut Fair, k: &Arc<str>, sh: Share, asked: u64, used: u64) {
        fair.asked(k, sh, asked);
        fair.answered(k);
        fair.charge(k, used);
    }

    /// Regression (issue 51): the refund was recomputed from the share at
    /// the answer, so a reload between ask and answer (weight 1 to 4)
    /// gave back a quarter of the charge and clamped to zero the other
    /// way; now the answer gives back exactly what the ask charged.
    #[test]
    fn an_answer_refunds_exactly_what_its_ask_charged_across_a_reload() {
        for (row, (at_ask, at_answer)) in [(1, 4), (4, 1), (3, 3)].into_iter().enumerate() {
            let mut fair = Fair::new(4);
            let k = key("a");
            fair.join(&k, share(at_ask, 0.0), true);
            let before = fair.accounts[&k].vtime;
            fair.asked(&k, share(at_ask, 0.0), 5);
            fair.join(&k, share(at_answer, 0.0), false);
            fair.answered(&k);
            assert_eq!(
                fair.accounts[&k].vtime, before,
                "row {row}: weight {at_ask} at the ask, {at_answer} at the answer"
            );
        }
    }

    #[test]
    fn backlogged_sellers_are_served_units_in_proportion_to_their_weights() {
        // (sellers as (name, weight, cost of each job), turns, units served)
        type Case = (&'static [(&'static str, u32, u64)], usize, &'static [u64]);
        let cases: &[Case] = &[
            // 1. 1:2:4 over 70 turns: exact.
            (&[("a", 1, 1), ("b", 2, 1), ("c", 4, 1)], 70, &[10, 20, 40]),
            // 2. Equal weights: round robin.
            (&[("a", 1, 1), ("b", 1, 1)], 10, &[5, 5]),
            // 3. Costs count: a job of 30 takes 30 units' share, so the
            // weight-1 seller of cost-1 jobs gets as many units.
            (&[("a", 1, 30), ("b", 1, 1)], 62, &[60, 60]),
            // 4. A weight-3 seller of cost-3 jobs gets as many jobs as a
            // weight-1 seller of cost-1 jobs, 3 times the units.
            (&[("a", 3, 3), ("b", 1, 1)], 20, &[30, 10]),
            // 5. Alone: everything.
            (&[("a", 4, 1)], 9, &[9]),
        ];
        for (i, &(sellers, turns, want)) in cases.iter().enumerate() {
            let sellers: Vec<(&str, Share, u64)> = sellers
                .iter()
                .map(|&(n, w, c)| (n, share(w, 0.0), c))
                .collect();
            let served = serve(&sellers, turns);
            let got: Vec<u64> = sellers
                .iter()
                .map(|(n, _, _)| served.get(*n).copied().unwrap_or(0))
                .collect();
            assert_eq!(got, want, "case {}: {sellers:?}", i + 1);
        }
    }

    #[test]
    fn a_seller_back_from_away_gets_at_most_one_pool_of_credit() {
        let mut fair = Fair::new(4);
        let (a, b) = (key("a"), key("b"));
        let turn = |fair: &mut Fair, rejoin_b: bool| {
            let k = fair.next(&|_| 0, &|_| false).expect("a waiter");
            ask(fair, &k, share(1, 0.0), 1, 1);
            if k == a || rejoin_b {
                fair.join(&k, share(1, 0.0), true);
            }
            k.to_string()
        };
        fair.join(&a, share(1, 0.0), true);
        fair.join(&b, share(1, 0.0), true);
        // b is served once, then has nothing for a hundred of a's turns.
        let first: Vec<String> = (0..102).map(|_| turn(&mut fair, false)).collect();
        assert_eq!(first[..2], ["a", "b"]);
        assert!(first[2..].iter().all(|k| k == "a"));
        fair.join(&b, share(1, 0.0), true);
        let back: Vec<String> = (0..10).map(|_| turn(&mut fair, true)).collect();
        // b catches up one pool (4 units) and a turn, then they
        // alternate: it did not save up a hundred turns of idleness.
        assert_eq!(back, ["b", "b", "b", "b", "b", "a", "b", "a", "b", "a"]);
    }

    #[test]
    fn a_grant_refunds_what_it_did_not_use() {
        let mut fair = Fair::new(4);
        let (a, b) = (key("a"), key("b"));
        fair.join(&a, share(1, 0.0), true);
        fair.join(&b, share(1, 0.0), true);
        assert_eq!(fair.next(&|_| 0, &|_| false), Some(a.clone()));
        // Refused: nothing used, nothing charged.
        ask(&mut fair, &a, share(1, 0.0), 3, 0);
        fair.join(&a, share(1, 0.0), true);
        assert_eq!(
            fair.next(&|_| 0, &|_| false),
            Some(b.clone()),
            "b waited longer"
        );
        ask(&mut fair, &b, share(1, 0.0), 1, 1);
        fair.join(&b, share(1, 0.0), true);
        assert_eq!(fair.next(&|_| 0, &|_| false), Some(a), "a was refunded");
    }

    #[test]
    fn a_seller_below_its_guaranteed_slots_goes_first() {
        // (min_share of "g", slots g holds, pool, g goes first)
        let cases: &[(f64, usize, usize, bool)] = &[
            (0.25, 0, 4, true),
            (0.25, 1, 4, false),
            (0.5, 1, 4, true),
            (0.1, 0, 4, true), // below one slot: still one
            (0.0, 0, 4, false),
        ];
        for (i, &(min, held, size, first)) in cases.iter().enumerate() {
            let mut fair = Fair::new(size);
            let (g, w) = (key("g"), key("w"));
            // w waits with a lower virtual time and a heavier weight.
            fair.join(&w, share(8, 0.0), true);
            fair.join(&g, share(1, min), true);
            ask(&mut fair, &g, share(1, min), 5, 5);
            let held_by = |k: &str| if k == "g" { held } else { 0 };
            let next = fair.next(&held_by, &|_| false).expect("a waiter");
            assert_eq!(next == g, first, "case {}", i + 1);
        }
    }

    #[test]
    fn the_allowance_splits_free_slots_by_weight() {
        // On a pool of 8 (a quantum of 2 units at weight 1), everyone
        // at the same virtual time:
        // (weight of "me", weights of the others waiting, free, allowance)
        let cases: &[(u32, &[u32], usize, usize)] = &[
            // 1. Alone: every free slot.
            (1, &[], 4, 4),
            // 2. A quantum of 2 units at weight 1.
            (1, &[1], 4, 2),
            // 3. Weight 2: twice the quantum.
            (2, &[1], 8, 4),
            // 4. Weight 4: 8 units, capped by the free slots.
            (4, &[1, 2], 7, 7),
            // 5. The others' weights do not shrink it.
            (1, &[4], 5, 2),
            // 6. Always at least one, never more than free.
            (1, &[1, 1, 1], 1, 1),
        ];
        for (i, &(mine, others, free, want)) in cases.iter().enumerate() {
            let mut fair = Fair::new(8);
            for (j, &w) in others.iter().enumerate() {
                fair.join(&key(&format!("o{j}")), share(w, 0.0), true);
            }
            fair.join(&key("me"), share(mine, 0.0), true);
            assert_eq!(fair.allowance("me", free), want, "case {}", i + 1);
        }
    }

    #[test]
    fn joining_twice_keeps_the_place_and_forgetting_leaves_the_turns() {
        let mut fair = Fair::new(2);
        let (a, b) = (key("a"), key("b"));
        fair.join(&a, share(1, 0.0), true);
        fair.join(&b, share(1, 0.0), true);
        fair.join(&a, share(1, 0.0), true);
        assert!(fair.others_wait("a"));
        assert_eq!(
            fair.next(&|_| 0, &|_| false),
            Some(a.clone()),
            "a joined first"
        );
        fair.forget(&b);
        assert!(!fair.others_wait("a"));
        assert_eq!(fair.next(&|_| 0, &|_| false), None);
    }
}
