//! The records of `lua/calls.lua`: what each charged jobs request charged,
//! kept a short while in the field `rec` of the seller's hash (its newest
//! few, within [`REC_BYTES`]), so that the cancel of a call whose answer
//! was lost gives it back, or, sent before the call ran, makes it charge
//! nothing (a tombstone, in the field `tomb` of the seller's hash). Only a
//! request whose block is the `block` field of the seller's hash records
//! (not the global rules' own call, nor shadow rules).

use crate::limiter::local::ModelStore;
use crate::limiter::script::{BlockRead, JobsRequest};

/// Most bytes the field `rec` keeps, in whole records (`REC_BYTES`).
pub const REC_BYTES: usize = 256;

/// Most bytes the field `tomb` keeps, in whole tombstones (`TOMB_BYTES`).
pub const TOMB_BYTES: usize = 512;

/// How long a record lives (µs) when the call does not say
/// (`CALL_LIFE_US` of calls.lua; `RedisStore` sends a few timeouts).
pub const CALL_LIFE_US: i128 = 5_000_000;

/// What a cancel found for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The call ran and charged `units` at `at`: give them back.
    Refund { at: i128, units: i128 },
    /// No record: a tombstone now makes the call charge nothing.
    Tombstone,
    /// Cancelled already, or not recorded (the global rules' call).
    Nothing,
}

/// The seller's hash, when the request's block is that hash's field.
fn hash_of(q: &JobsRequest) -> Option<&str> {
    (q.block.read == BlockRead::Field).then_some(q.block.key.as_str())
}

/// The length of a tombstone in its field: `;id,at`.
fn tomb_bytes((id, at): &(String, i128)) -> usize {
    2 + id.len() + at.to_string().len()
}

/// The length of a record in its field: `;id,at,units`.
fn rec_bytes((id, at, units): &(String, i128, i128)) -> usize {
    3 + id.len() + at.to_string().len() + units.to_string().len()
}

/// `tomb_find`: whether the first tombstone of `id` is younger than the life.
fn tomb_live(store: &ModelStore, hash: &str, id: &str, now: i128) -> bool {
    store
        .calls
        .get(hash)
        .and_then(|f| f.tombs.iter().find(|(t, _)| t == id))
        .is_some_and(|(_, at)| at + CALL_LIFE_US > now)
}

/// `list_append`: the stale entries at the front go, `item` is appended,
/// then whole ones go from the front until the list takes at most `most`
/// bytes (all are kept when the last alone is longer).
fn append<T>(
    list: &mut Vec<T>,
    item: T,
    now: i128,
    most: usize,
    at: impl Fn(&T) -> i128,
    bytes: impl Fn(&T) -> usize,
) {
    let stale = list
        .iter()
        .position(|e| at(e) + CALL_LIFE_US > now)
        .unwrap_or(list.len());
    list.drain(..stale);
    list.push(item);
    let mut total: usize = list.iter().map(&bytes).sum();
    let last = list.last().map_or(0, &bytes);
    if total > most && last <= most {
        let mut cut = 0;
        while total > most {
            total -= bytes(&list[cut]);
            cut += 1;
        }
        list.drain(..cut);
    }
}

/// `tomb_write`: the call's tombstone appended to the field `tomb`.
fn tomb_write(store: &mut ModelStore, hash: &str, now: i128, id: &str) {
    let list = &mut store.calls.entry(hash.to_owned()).or_default().tombs;
    append(
        list,
        (id.to_owned(), now),
        now,
        TOMB_BYTES,
        |t| t.1,
        tomb_bytes,
    );
}

/// `calls_write`: the call's record appended to the field `rec`.
fn write(store: &mut ModelStore, hash: &str, now: i128, id: &str, units: i128) {
    let list = &mut store.calls.entry(hash.to_owned()).or_default().recs;
    append(
        list,
        (id.to_owned(), now, units),
        now,
        REC_BYTES,
        |r| r.1,
        rec_bytes,
    );
}

/// Whether a cancel came before this request ran (its tombstone is there).
pub(super) fn cancelled_before(store: &ModelStore, q: &JobsRequest, now: i128) -> bool {
    hash_of(q).is_some_and(|hash| tomb_live(store, hash, &q.call_id, now))
}

/// Records that the request charged `units` now.
pub(super) fn record(store: &mut ModelStore, q: &JobsRequest, now: i128, units: i128) {
    if let Some(hash) = hash_of(q) {
        write(store, hash, now, &q.call_id, units);
    }
}

/// The record side of a cancel: its record (the first of its id, when
/// live) goes and a tombstone is left; the caller refunds what
/// [`Cancelled::Refund`] names.
pub(super) fn cancel(store: &mut ModelStore, q: &JobsRequest, now: i128) -> Cancelled {
    let Some(hash) = hash_of(q) else {
        return Cancelled::Nothing;
    };
    if tomb_live(store, hash, &q.call_id, now) {
        return Cancelled::Nothing;
    }
    let fields = store.calls.entry(hash.to_owned()).or_default();
    let found = fields
        .recs
        .iter()
        .position(|(id, _, _)| *id == q.call_id)
        .filter(|&i| fields.recs[i].1 + CALL_LIFE_US > now);
    let found = found.map(|i| fields.recs.remove(i));
    tomb_write(store, hash, now, &q.call_id);
    match found {
        Some((_, at, units)) => Cancelled::Refund { at, units },
        None => Cancelled::Tombstone,
    }
}

/// The records the seller's hash `hash` holds (tests: the bound).
pub fn records<'a>(store: &'a ModelStore, hash: &str) -> &'a [(String, i128, i128)] {
    store.calls.get(hash).map_or(&[], |f| f.recs.as_slice())
}
