//! [`Parts`]: what this replica was granted lately, per seller and rule,
//! kept to write back its part of each seller's state when Redis loses it
//! (`lua/restore.lua`).
//!
//! Every replica keeps only its own grants, so the replicas' parts add up
//! to the whole state with none counted twice: what a replica restarted
//! since (or forgot, past its budget) held is what a restore cannot bring
//! back. Grants are kept in slices (at most [`SLICES`] per rule period,
//! each its units and the instant of its last grant) for at most a
//! period: bytes grow with sellers and rules, not with traffic.
//!
//! Bounded by a byte budget (`redis.restore_bytes`): past it the seller
//! granted least recently is forgotten first. The bytes are an estimate
//! (the heap each entry holds), counted by the caller in a gauge.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::mem::size_of;
use std::sync::{Arc, Mutex, MutexGuard};

use super::script::KeyedRule;

/// Slices per rule period: a restored sliding log keeps each unit at most
/// a period / SLICES later than it was taken.
pub const SLICES: u64 = 32;

/// Grants kept exactly, per hash, besides the slices: those of the last
/// [`RECENT_US`], at most [`RECENT_MAX`]. A partial loss takes back the
/// last moments of writes (a failover's replication lag), and its restore
/// must tell the grants after the point the state went back to from those
/// before it, which a slice of an hour's rule (almost two minutes) cannot.
pub const RECENT_US: u64 = 10_000_000;
pub const RECENT_MAX: usize = 64;

/// One slice of grants: `units` granted from `first_us` to `last_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slice {
    first_us: u64,
    last_us: u64,
    units: u64,
}

#[derive(Debug)]
struct RulePart {
    rule: KeyedRule,
    slices: VecDeque<Slice>,
}

impl RulePart {
    fn width_us(&self) -> u64 {
        (self.rule.1.period_us() / SLICES).max(1_000)
    }

    fn bytes(&self) -> usize {
        size_of::<RulePart>()
            + self.rule.0.key.len()
            + self.rule.0.place.len()
            + self.slices.capacity() * size_of::<Slice>()
    }
}

#[derive(Debug)]
struct Seller {
    /// The tick of its last grant (least recently granted: evicted first).
    touched: u64,
    rules: Vec<RulePart>,
    bytes: usize,
    /// A seller's own hash: this replica's last grant there and until when
    /// the hash must live after it (µs on Redis' clock), carried on each
    /// call to find a partial loss (`rollback_hold`, `lua/common.lua`).
    mark: Option<(u64, u64)>,
    /// The grants of the last [`RECENT_US`] exactly, `(µs, units)`, and
    /// the newest instant among those dropped from it: every grant after
    /// that is here.
    recent: VecDeque<(u64, u64)>,
    recent_from: u64,
}

/// One hash's parts (a seller's, or the global rules'), as a restore
/// sends them: per rule, `(µs, units)` granted before the loss, oldest
/// first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SellerPart {
    /// The hash the rules' places are in.
    pub key: Arc<str>,
    pub rules: Vec<(KeyedRule, Vec<(u64, u64)>)>,
    /// This replica's last grant in the hash (µs), when it is a seller's:
    /// the restore writes it as the replica's mark.
    pub last_us: Option<u64>,
}

/// A replica's recent grants, per seller and rule, within a byte budget.
#[derive(Debug)]
pub struct Parts {
    budget: usize,
    bytes: usize,
    tick: u64,
    sellers: HashMap<Arc<str>, Seller>,
    /// `touched` → seller: the eviction order.
    order: BTreeMap<u64, Arc<str>>,
    evicted: u64,
}

impl Parts {
    pub fn new(budget: usize) -> Parts {
        Parts {
            budget,
            bytes: 0,
            tick: 0,
            sellers: HashMap::new(),
            order: BTreeMap::new(),
            evicted: 0,
        }
    }

    /// The bytes held (an estimate).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sellers held.
    pub fn sellers(&self) -> usize {
        self.sellers.len()
    }

    /// Sellers forgotten for the budget since the start.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// `units` granted at `at_us` (Redis' clock) under `rules`: each
    /// rule's part is kept with its hash (a seller's, or the global
    /// rules', which every seller's grants add to).
    pub fn record(&mut self, rules: &[KeyedRule], at_us: u64, units: u64) {
        if units == 0 {
            return;
        }
        let mut keys: Vec<&str> = rules.iter().map(|(at, _)| at.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            let of_key: Vec<&KeyedRule> = rules.iter().filter(|(at, _)| at.key == key).collect();
            self.record_at(key, &of_key, at_us, units);
        }
    }

    fn record_at(&mut self, seller: &str, rules: &[&KeyedRule], at_us: u64, units: u64) {
        self.tick += 1;
        let tick = self.tick;
        let key: Arc<str> = Arc::from(seller);
        let entry = self.sellers.entry(key.clone()).or_insert_with(|| Seller {
            touched: 0,
            rules: Vec::new(),
            bytes: 0,
            mark: None,
            recent: VecDeque::new(),
            recent_from: 0,
        });
        self.order.remove(&entry.touched);
        entry.touched = tick;
        self.order.insert(tick, key.clone());
        for rule in rules {
            let at = match entry.rules.iter().position(|p| &p.rule == *rule) {
                Some(i) => i,
                None => {
                    entry.rules.push(RulePart {
                        rule: (*rule).clone(),
                        slices: VecDeque::new(),
                    });
                    entry.rules.len() - 1
                }
            };
            let part = &mut entry.rules[at];
            let width = part.width_us();
            match part.slices.back_mut() {
                Some(s) if at_us < s.first_us + width => {
                    s.last_us = s.last_us.max(at_us);
                    s.units += units;
                }
                _ => part.slices.push_back(Slice {
                    first_us: at_us,
                    last_us: at_us,
                    units,
                }),
            }
        }
        // What no rule counts any more goes: a slice older than its
        // rule's period, then a rule (an edited one) with nothing left.
        for part in &mut entry.rules {
            let period = part.rule.1.period_us();
            while part
                .slices
                .front()
                .is_some_and(|s| s.last_us.saturating_add(period) < at_us)
            {
                part.slices.pop_front();
            }
        }
        entry.rules.retain(|p| !p.slices.is_empty());
        entry.recent.push_back((at_us, units));
        while entry.recent.len() > RECENT_MAX
            || entry
                .recent
                .front()
                .is_some_and(|&(at, _)| at.saturating_add(RECENT_US) < at_us)
        {
            let (at, _) = entry.recent.pop_front().expect("not empty");
            entry.recent_from = entry.recent_from.max(at);
        }
        let bytes = size_of::<Seller>()
            + seller.len()
            + entry.recent.capacity() * size_of::<(u64, u64)>()
            + entry.rules.iter().map(RulePart::bytes).sum::<usize>();
        self.bytes = self.bytes + bytes - entry.bytes;
        entry.bytes = bytes;
        self.evict();
    }

    /// Forgets the least recently granted sellers while over the budget,
    /// never the one just granted unless it alone is over.
    fn evict(&mut self) {
        // The seller just granted has the newest tick: it is the first in
        // line only when it is alone, and then it alone is over.
        while self.bytes > self.budget {
            let Some((_, seller)) = self.order.pop_first() else {
                return;
            };
            self.forget(&seller);
        }
    }

    fn forget(&mut self, seller: &Arc<str>) {
        if let Some(s) = self.sellers.remove(seller) {
            self.bytes -= s.bytes;
            self.evicted += 1;
        }
    }

    /// A grant of `at_us` marked in hash `key` (recorded first): a
    /// seller's own, or the global rules'; after it the hash lives until
    /// `live_us` at least.
    pub fn mark(&mut self, key: &str, at_us: u64, live_us: u64) {
        if let Some(s) = self.sellers.get_mut(key) {
            if s.mark.is_none_or(|(at, _)| at <= at_us) {
                s.mark = Some((at_us, live_us));
            }
        }
    }

    /// This replica's last grant in `key` and until when the hash lives.
    pub fn marked(&self, key: &str) -> Option<(u64, u64)> {
        self.sellers.get(key)?.mark
    }

    /// The hashes this replica holds grants in.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.sellers.keys()
    }

    /// Every seller's grants before `lost_us`, as restores send them: a
    /// slice that ends after the loss is sent whole, at the loss less 1 µs
    /// (some of it may count twice: later, never less). In the hashes'
    /// order, not the map's: the restores then run in the same order every
    /// time, and a seeded simulation replays them alike (the map's random
    /// order made seed 4839 run three different ways in 30 replays).
    pub fn before(&self, lost_us: u64) -> Vec<SellerPart> {
        let mut parts: Vec<SellerPart> = self
            .sellers
            .iter()
            .filter_map(|(key, s)| part_of(key, s, lost_us))
            .collect();
        parts.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        parts
    }

    /// Every seller hash's grants before `found_us` ([`Parts::before_in`]),
    /// by key: a move of the server took every hash back at once. Only the
    /// hashes this replica marks (its sellers', and the global rules'),
    /// whose restore can tell the grants the older state still holds from
    /// those it lost.
    pub fn before_each_marked(&self, found_us: u64) -> Vec<SellerPart> {
        let mut keys: Vec<&Arc<str>> = self
            .sellers
            .iter()
            .filter(|(_, s)| s.mark.is_some())
            .map(|(k, _)| k)
            .collect();
        keys.sort_unstable();
        keys.into_iter()
            .filter_map(|k| self.before_in(k, found_us))
            .collect()
    }

    /// One hash's grants before `found_us`, as the restore of a partial
    /// loss sends them: the recent ones each at its own instant, so the
    /// script can keep exactly those after the point the state went back
    /// to; older ones by slice, at the slice's last grant (or the oldest
    /// kept exactly, when the slice goes on into them).
    pub fn before_in(&self, key: &str, found_us: u64) -> Option<SellerPart> {
        let (key, s) = self.sellers.get_key_value(key)?;
        let exact: Vec<(u64, u64)> = s
            .recent
            .iter()
            .copied()
            .filter(|&(at, _)| at < found_us)
            .collect();
        let rules: Vec<(KeyedRule, Vec<(u64, u64)>)> = s
            .rules
            .iter()
            .map(|p| {
                let start = p.slices.front().map_or(u64::MAX, |sl| sl.first_us);
                let mut part: Vec<(u64, u64)> = p
                    .slices
                    .iter()
                    .filter(|sl| sl.first_us < found_us && sl.first_us <= s.recent_from)
                    .filter_map(|sl| {
                        // The slice's grants that are not kept exactly.
                        let kept: u64 = s
                            .recent
                            .iter()
                            .filter(|&&(at, _)| at >= sl.first_us && at <= sl.last_us)
                            .map(|&(_, n)| n)
                            .sum();
                        let older = sl.units.saturating_sub(kept);
                        let at = sl.last_us.min(s.recent_from).min(found_us - 1);
                        (older > 0).then_some((at, older))
                    })
                    .collect();
                part.extend(exact.iter().copied().filter(|&(at, _)| at >= start));
                part.sort_unstable();
                (p.rule.clone(), part)
            })
            .filter(|(_, part)| !part.is_empty())
            .collect();
        (!rules.is_empty()).then(|| SellerPart {
            key: key.clone(),
            rules,
            last_us: s.mark.map(|(at, _)| at),
        })
    }
}

/// A hash's slices that begin before `before_us`, each at its last grant
/// (at most `before_us` less 1 µs).
fn part_of(key: &Arc<str>, s: &Seller, before_us: u64) -> Option<SellerPart> {
    let rules: Vec<(KeyedRule, Vec<(u64, u64)>)> = s
        .rules
        .iter()
        .map(|p| {
            let part = p
                .slices
                .iter()
                .filter(|sl| sl.first_us < before_us)
                .map(|sl| (sl.last_us.min(before_us - 1), sl.units))
                .collect();
            (p.rule.clone(), part)
        })
        .filter(|(_, part): &(KeyedRule, Vec<(u64, u64)>)| !part.is_empty())
        .collect();
    (!rules.is_empty()).then(|| SellerPart {
        key: key.clone(),
        rules,
        last_us: s.mark.map(|(at, _)| at),
    })
}

/// This replica's grants and what it knows of the epoch: what the
/// [`Limiter`](super::Limiter) holds for restores (`restore.rs`).
pub struct Restorer {
    /// The replica's name (its worker id): its part counts once per loss.
    pub(super) replica: String,
    /// Its short name in the marks of its grants (`w:<tag>`).
    pub(super) tag: String,
    /// The last find of a partial loss read (µs), so each is restored once.
    pub(super) rollbacks_read: Mutex<u64>,
    pub(super) parts: Mutex<Parts>,
    /// The epoch as last read, and the loss last restored.
    pub(super) watch: Mutex<(Option<u64>, Option<u64>)>,
    /// Redis Cluster: per hash slot, the loss its epoch last named (each
    /// slot has an epoch of its own).
    pub(super) slots: Mutex<HashMap<u16, u64>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic mid-update leaves at worst a part too small or too large by
    // one grant: still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::rule::{Algorithm, Rule};
    use crate::limiter::script::StateKey;
    use std::time::Duration;

    fn rule(period_s: u64) -> KeyedRule {
        rule_of("s", period_s)
    }

    fn rule_of(seller: &str, period_s: u64) -> KeyedRule {
        (
            StateKey::new(seller, "r0"),
            Rule::new(
                Algorithm::SlidingWindowLog,
                10,
                Duration::from_secs(period_s),
                None,
            )
            .unwrap(),
        )
    }

    /// Restores go out in the hashes' order, whatever order the sellers
    /// were granted in: a seeded world replays them alike.
    #[test]
    fn parts_before_a_loss_come_in_the_hashes_order() {
        let mut p = Parts::new(1 << 20);
        let sellers: Vec<String> = (0..40).map(|i| format!("s{}", (i * 17) % 40)).collect();
        for (i, seller) in sellers.iter().enumerate() {
            p.record(&[rule_of(seller, 32)], 1_000_000 + i as u64, 1);
        }
        let keys: Vec<Arc<str>> = p.before(u64::MAX).into_iter().map(|s| s.key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys.len(), 40);
        assert_eq!(keys, sorted);
    }

    #[test]
    fn grants_close_in_time_share_a_slice_and_old_ones_leave() {
        let mut p = Parts::new(1 << 20);
        let r = [rule(32)];
        // A slice is 1 s wide for a 32 s period.
        p.record(&r, 1_000_000, 2);
        p.record(&r, 1_500_000, 3);
        p.record(&r, 2_100_000, 1);
        let got = p.before(u64::MAX);
        assert_eq!(got[0].rules[0].1, vec![(1_500_000, 5), (2_100_000, 1)]);
        // 40 s later the first two slices no longer count.
        p.record(&r, 34_200_000, 1);
        let got = p.before(u64::MAX);
        assert_eq!(got[0].rules[0].1, vec![(34_200_000, 1)]);
    }

    #[test]
    fn only_grants_before_the_loss_are_sent_and_a_straddling_slice_whole() {
        let mut p = Parts::new(1 << 20);
        let r = [rule(32)];
        p.record(&r, 1_000_000, 2);
        p.record(&r, 1_600_000, 3);
        p.record(&r, 5_000_000, 4);
        // Lost at 1.4 s: the first slice began before it, so all of it
        // goes, at the loss; the later slice is Redis' own since.
        assert_eq!(p.before(1_400_000)[0].rules[0].1, vec![(1_399_999, 5)]);
        assert!(
            p.before(1_000_000).is_empty(),
            "nothing before the first grant"
        );
    }

    #[test]
    fn past_the_budget_the_least_recently_granted_seller_goes_first() {
        let (a, b, c) = ([rule_of("a", 60)], [rule_of("b", 60)], [rule_of("c", 60)]);
        let mut probe = Parts::new(usize::MAX);
        probe.record(&a, 1, 1);
        let one = probe.bytes();
        let mut p = Parts::new(2 * one + one / 2);
        p.record(&a, 1, 1);
        p.record(&b, 2, 1);
        p.record(&a, 3, 1);
        p.record(&c, 4, 1);
        let mut kept: Vec<String> = p
            .before(u64::MAX)
            .iter()
            .map(|s| s.key.to_string())
            .collect();
        kept.sort();
        assert_eq!(kept, ["a", "c"], "b was granted least recently");
        assert_eq!(p.evicted(), 1);
        assert!(p.bytes() <= 2 * one + one / 2);
    }

    #[test]
    fn a_global_rule_is_kept_once_with_its_own_hash() {
        let mut p = Parts::new(1 << 20);
        let global = (
            StateKey::new("g", "g0"),
            Rule::new(Algorithm::FixedWindow, 100, Duration::from_secs(60), None).unwrap(),
        );
        p.record(&[rule_of("a", 60), global.clone()], 1_000_000, 2);
        p.record(&[rule_of("b", 60), global], 1_100_000, 3);
        let mut got = p.before(u64::MAX);
        got.sort_by(|x, y| x.key.cmp(&y.key));
        let keys: Vec<&str> = got.iter().map(|s| &*s.key).collect();
        assert_eq!(keys, ["a", "b", "g"]);
        assert_eq!(
            got[2].rules[0].1,
            vec![(1_100_000, 5)],
            "both sellers' grants"
        );
    }

    #[test]
    fn a_partial_loss_gets_recent_grants_each_at_its_instant_and_older_ones_by_slice() {
        let mut p = Parts::new(1 << 20);
        // An hour's rule: one slice is almost two minutes wide.
        let r = [rule(3600)];
        p.record(&r, 1_000_000, 5);
        // 19 s later the first grant is no longer kept exactly.
        p.record(&r, 20_000_000, 2);
        p.record(&r, 25_000_000, 3);
        let got = p.before_in("s", 26_000_000).expect("a part");
        assert_eq!(
            got.rules[0].1,
            vec![(1_000_000, 5), (20_000_000, 2), (25_000_000, 3)],
            "one slice, told apart"
        );
        let got = p.before_in("s", 22_000_000).expect("a part");
        assert_eq!(
            got.rules[0].1,
            vec![(1_000_000, 5), (20_000_000, 2)],
            "nothing from the find on"
        );
        assert!(p.before_in("t", 26_000_000).is_none(), "another hash");
    }

    #[test]
    fn past_the_most_kept_exactly_the_oldest_go_back_to_their_slice() {
        let mut p = Parts::new(1 << 20);
        let r = [rule(3600)];
        for i in 0..RECENT_MAX as u64 + 2 {
            p.record(&r, 1_000_000 + i, 1);
        }
        let got = p.before_in("s", u64::MAX).expect("a part");
        let units: u64 = got.rules[0].1.iter().map(|&(_, n)| n).sum();
        assert_eq!(units, RECENT_MAX as u64 + 2, "every unit, once");
        assert_eq!(
            got.rules[0].1[0],
            (1_000_001, 2),
            "the two dropped, at the newest of them"
        );
    }

    #[test]
    fn the_mark_is_the_last_grant_and_how_long_the_hash_lives() {
        let mut p = Parts::new(1 << 20);
        let r = [rule(60)];
        assert_eq!(p.marked("s"), None);
        p.record(&r, 1_000_000, 1);
        p.mark("s", 1_000_000, 61_000_000);
        p.mark("s", 900_000, 70_000_000);
        assert_eq!(p.marked("s"), Some((1_000_000, 61_000_000)), "never back");
        assert_eq!(p.before(u64::MAX)[0].last_us, Some(1_000_000));
        p.mark("unknown", 1, 2);
        assert_eq!(p.marked("unknown"), None, "only a hash with grants");
    }

    #[test]
    fn an_edited_rule_is_a_part_of_its_own_and_the_old_one_ages_out() {
        let mut p = Parts::new(1 << 20);
        p.record(&[rule(1)], 1_000_000, 1);
        p.record(&[rule(2)], 1_100_000, 1);
        assert_eq!(p.before(u64::MAX)[0].rules.len(), 2);
        p.record(&[rule(2)], 3_000_000, 1);
        assert_eq!(p.before(u64::MAX)[0].rules.len(), 1);
    }
}
