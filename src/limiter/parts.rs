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
}

/// One hash's parts (a seller's, or the global rules'), as a restore
/// sends them: per rule, `(µs, units)` granted before the loss, oldest
/// first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SellerPart {
    /// The hash the rules' places are in.
    pub key: Arc<str>,
    pub rules: Vec<(KeyedRule, Vec<(u64, u64)>)>,
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
        let bytes = size_of::<Seller>()
            + seller.len()
            + entry.rules.iter().map(RulePart::bytes).sum::<usize>();
        self.bytes = self.bytes + bytes - entry.bytes;
        entry.bytes = bytes;
        self.evict(&key);
    }

    /// Forgets the least recently granted sellers while over the budget,
    /// never `keep` (the one just granted) unless it alone is over.
    fn evict(&mut self, keep: &Arc<str>) {
        while self.bytes > self.budget {
            let Some((&tick, seller)) = self.order.iter().next() else {
                return;
            };
            if seller == keep && self.sellers.len() > 1 {
                // It is the newest; anything older goes first.
                let Some((&older, _)) = self.order.iter().find(|(_, s)| *s != keep) else {
                    return;
                };
                let seller = self.order.remove(&older).expect("listed");
                self.forget(&seller);
                continue;
            }
            let seller = self.order.remove(&tick).expect("listed");
            self.forget(&seller);
        }
    }

    fn forget(&mut self, seller: &Arc<str>) {
        if let Some(s) = self.sellers.remove(seller) {
            self.bytes -= s.bytes;
            self.evicted += 1;
        }
    }

    /// Every seller's grants before `lost_us`, as restores send them: a
    /// slice that ends after the loss is sent whole, at the loss less 1 µs
    /// (some of it may count twice: later, never less).
    pub fn before(&self, lost_us: u64) -> Vec<SellerPart> {
        self.sellers
            .iter()
            .filter_map(|(seller, s)| {
                let rules: Vec<(KeyedRule, Vec<(u64, u64)>)> = s
                    .rules
                    .iter()
                    .map(|p| {
                        let part = p
                            .slices
                            .iter()
                            .filter(|sl| sl.first_us < lost_us)
                            .map(|sl| (sl.last_us.min(lost_us - 1), sl.units))
                            .collect();
                        (p.rule.clone(), part)
                    })
                    .filter(|(_, part): &(KeyedRule, Vec<(u64, u64)>)| !part.is_empty())
                    .collect();
                (!rules.is_empty()).then(|| SellerPart {
                    key: seller.clone(),
                    rules,
                })
            })
            .collect()
    }
}

/// This replica's grants and what it knows of the epoch: what the
/// [`Limiter`](super::Limiter) holds for restores (`restore.rs`).
pub struct Restorer {
    /// The replica's name (its worker id): its part counts once per loss.
    pub(super) replica: String,
    pub(super) parts: Mutex<Parts>,
    /// The epoch as last read, and the loss last restored.
    pub(super) watch: Mutex<(Option<u64>, Option<u64>)>,
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
    fn an_edited_rule_is_a_part_of_its_own_and_the_old_one_ages_out() {
        let mut p = Parts::new(1 << 20);
        p.record(&[rule(1)], 1_000_000, 1);
        p.record(&[rule(2)], 1_100_000, 1);
        assert_eq!(p.before(u64::MAX)[0].rules.len(), 2);
        p.record(&[rule(2)], 3_000_000, 1);
        assert_eq!(p.before(u64::MAX)[0].rules.len(), 1);
    }
}
