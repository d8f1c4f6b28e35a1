//! The Redis keyspace of the scripts, in memory: what each key holds
//! ([`State`]) and the store ([`ModelStore`]) the local fallback and the
//! tests' reference model both run on.

use std::collections::HashMap;

pub use super::state::{State, Tat};
use crate::limiter::script::BlockAt;

/// The Redis keyspace of the scripts, in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelStore {
    /// State address ([`StateKey::address`]) → value; a state is absent
    /// exactly when Redis would not have it (modulo expiry, which is not
    /// modelled). A v2 place is `hash#place`, a v2 block `hash#block`.
    pub(crate) entries: HashMap<String, State>,
    /// State v2: the fingerprint of the rule that wrote each place (the
    /// place's `fp` field).
    marks: HashMap<String, String>,
    /// `max_in_flight`: per sorted set, each lease with the µs instant it
    /// lapses (`lua/slots.lua`). Only the jobs driver of the test kit
    /// takes and gives back slots, so the fallback's store has no field.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) slots: HashMap<String, std::collections::BTreeMap<String, i128>>,
    /// Per seller hash, its fields of `lua/calls.lua` (charged calls'
    /// records, cancels' tombstones), which the test kit's jobs driver
    /// writes.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) calls: HashMap<String, CallsFields>,
    /// The epoch keys of `lua/jobs.lua`'s loss guard: µs the state was
    /// last found lost. Cleared with everything else by a loss.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) epochs: HashMap<String, i128>,
}

#[cfg(any(test, feature = "testkit"))]
/// What the seller's hash holds for its calls, oldest first: the field
/// `tomb` (tombstones: call id and the cancel's µs instant) and the field
/// `rec` (records: call id, the µs instant it charged, its units).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallsFields {
    pub tombs: Vec<(String, i128)>,
    pub recs: Vec<(String, i128, i128)>,
}

impl ModelStore {
    pub fn new() -> ModelStore {
        ModelStore::default()
    }

    pub fn get(&self, key: &str) -> Option<&State> {
        self.entries.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut State> {
        self.entries.get_mut(key)
    }

    pub fn put(&mut self, key: &str, state: State) {
        self.entries.insert(key.to_owned(), state);
    }

    /// Forgets a state (v2: every field of its place, its `fp` too).
    pub fn remove(&mut self, key: &str) {
        self.entries.remove(key);
        self.marks.remove(key);
    }

    /// Empties a state but keeps its rule's mark: a v2 place whose fields
    /// say "nothing" (an emptied log) still names its rule.
    pub fn empty(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// State v2: the fingerprint of the rule that wrote the place at `key`.
    pub fn mark(&self, key: &str) -> Option<&str> {
        self.marks.get(key).map(String::as_str)
    }

    pub fn set_mark(&mut self, key: &str, fingerprint: String) {
        self.marks.insert(key.to_owned(), fingerprint);
    }

    /// The loss guard's epoch at `key` (µs; `lua/jobs.lua`).
    #[cfg(any(test, feature = "testkit"))]
    pub fn epoch(&self, key: &str) -> Option<i128> {
        self.epochs.get(key).copied()
    }

    /// Writes the loss guard's epoch, as an install that has run before.
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_epoch(&mut self, key: &str, at_us: i128) {
        self.epochs.insert(key.to_owned(), at_us);
    }

    /// The block as the limiter reads it (`None`: not read, or none).
    pub(crate) fn block_until(&self, at: &BlockAt) -> Option<i128> {
        match self.get(&at.address()?) {
            Some(State::Block(until)) => Some(*until),
            _ => None,
        }
    }
}
