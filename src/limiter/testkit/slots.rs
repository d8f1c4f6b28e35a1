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
