//! The records of `lua/calls.lua`: what each charged jobs request charged,
//! kept a short while in the seller's hash, so that the cancel of a call
//! whose answer was lost gives it back, or, sent before the call ran, makes
//! it charge nothing. State v2 and v1+v2 only (a request whose block is the
//! `block` field of the seller's hash); v1 records nothing.

use super::ModelStore;
use crate::limiter::script::{BlockRead, JobsRequest};

/// Most bytes the field keeps, in whole records (`CALLS_BYTES` of
/// calls.lua).
pub const CALLS_BYTES: usize = 2048;

/// How long a record lives (µs) when the call does not say
/// (`CALL_LIFE_US` of calls.lua; `RedisStore` sends a few timeouts).
pub const CALL_LIFE_US: i128 = 5_000_000;

/// One record: call `id` charged `units` at `at` (µs), or, with `units`
/// 0, a tombstone left by a cancel at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub id: String,
    pub at: i128,
    pub units: i128,
}

/// What a cancel found for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The call ran and charged `units` at `at`: give them back.
    Refund { at: i128, units: i128 },
    /// No record: a tombstone now makes the call charge nothing.
    Tombstone,
    /// Cancelled already, or not recorded (v1, the global rules' call).
    Nothing,
}

/// The hash a request's records live in: the seller's, when its block is
/// that hash's field.
fn hash_of(q: &JobsRequest) -> Option<&str> {
    (q.block.read == BlockRead::Field).then_some(q.block.key.as_str())
}

impl CallRecord {
    /// Its length in the field: `;id,at,units`.
    fn bytes(&self) -> usize {
        3 + self.id.len() + self.at.to_string().len() + self.units.to_string().len()
    }
}

/// The live record of `id` in `hash` (the first of `id`, if younger than
/// the life), with its index.
fn find(store: &ModelStore, hash: &str, id: &str, now: i128) -> Option<(usize, CallRecord)> {
    let list = store.calls.get(hash)?;
    let i = list.iter().position(|c| c.id == id)?;
    let c = &list[i];
    (c.at + CALL_LIFE_US > now).then(|| (i, c.clone()))
}

/// `calls_write`: the stale records at the front go, this one is
/// appended, then whole records go from the front until the field holds
/// at most [`CALLS_BYTES`] (all are kept when the last alone is longer).
fn write(store: &mut ModelStore, hash: &str, now: i128, id: &str, units: i128) {
    let list = store.calls.entry(hash.to_owned()).or_default();
    let stale = list
        .iter()
        .position(|c| c.at + CALL_LIFE_US > now)
        .unwrap_or(list.len());
    list.drain(..stale);
    list.push(CallRecord {
        id: id.to_owned(),
        at: now,
        units,
    });
    let mut total: usize = list.iter().map(CallRecord::bytes).sum();
    let last = list.last().map_or(0, CallRecord::bytes);
    if total > CALLS_BYTES && last <= CALLS_BYTES {
        let mut cut = 0;
        while total > CALLS_BYTES {
            total -= list[cut].bytes();
            cut += 1;
        }
        list.drain(..cut);
    }
}

/// Whether a cancel came before this request ran (its tombstone is there).
pub(super) fn cancelled_before(store: &ModelStore, q: &JobsRequest, now: i128) -> bool {
    hash_of(q)
        .and_then(|hash| find(store, hash, &q.call_id, now))
        .is_some_and(|(_, c)| c.units == 0)
}

/// Records that the request charged `units` now.
pub(super) fn record(store: &mut ModelStore, q: &JobsRequest, now: i128, units: i128) {
    if let Some(hash) = hash_of(q) {
        write(store, hash, now, &q.call_id, units);
    }
}

/// The record side of a cancel: the record becomes a tombstone (or one is
/// left); the caller refunds what [`Cancelled::Refund`] names.
pub(super) fn cancel(store: &mut ModelStore, q: &JobsRequest, now: i128) -> Cancelled {
    let Some(hash) = hash_of(q) else {
        return Cancelled::Nothing;
    };
    let found = find(store, hash, &q.call_id, now);
    if found.as_ref().is_some_and(|(_, c)| c.units == 0) {
        return Cancelled::Nothing;
    }
    if let (Some((i, _)), Some(list)) = (&found, store.calls.get_mut(hash)) {
        // The record goes; its tombstone is appended.
        list.remove(*i);
    }
    write(store, hash, now, &q.call_id, 0);
    match found {
        Some((_, c)) => Cancelled::Refund {
            at: c.at,
            units: c.units,
        },
        None => Cancelled::Tombstone,
    }
}
