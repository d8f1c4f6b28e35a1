//! `lua/slots.lua` in Rust: the leases of `max_in_flight`, one sorted set
//! per capped seller, as the jobs driver takes and gives them back.

use crate::limiter::local::ModelStore;
use crate::limiter::script::SlotTerms;

impl ModelStore {
    /// Leases of the sorted set `key` that have not lapsed at `now`.
    pub fn slots_live(&self, key: &str, now: i128) -> usize {
        self.slots
            .get(key)
            .map_or(0, |set| set.values().filter(|&&until| until > now).count())
    }

    /// `slots_free` after a loss (`lost`, the loss guard's epoch): a set
    /// gone within one lease of the loss counts as full until then; a
    /// charging call writes the `max` leases that say so. Answers whether
    /// it counts as full.
    pub(super) fn slots_lost(
        &mut self,
        s: &SlotTerms,
        lost: i128,
        now: i128,
        charge: bool,
    ) -> bool {
        let until = lost.min(now) + i128::from(s.lease_us);
        let gone = self.slots.get(&s.key).is_none_or(|set| set.is_empty());
        if now >= until || !gone {
            return false;
        }
        if charge {
            let set = self.slots.entry(s.key.clone()).or_default();
            for j in 1..=s.max {
                set.insert(format!("lost:{j}"), until);
            }
        }
        true
    }

    /// `slots_take`: a lease per granted job of call `id`, lapsed ones
    /// dropped.
    pub(super) fn slots_take(&mut self, key: &str, now: i128, id: &str, jobs: usize, until: i128) {
        let set = self.slots.entry(key.to_owned()).or_default();
        set.retain(|_, &mut t| t > now);
        for j in 0..jobs {
            set.insert(SlotTerms::lease(id, j), until);
        }
    }

    /// `slots_release`: how many of `leases` were still held.
    pub fn release(&mut self, key: &str, leases: &[String]) -> u64 {
        let Some(set) = self.slots.get_mut(key) else {
            return 0;
        };
        let n = leases.iter().filter(|l| set.remove(*l).is_some()).count();
        if set.is_empty() {
            self.slots.remove(key);
        }
        n as u64
    }
}
