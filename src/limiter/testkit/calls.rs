//! The records of `lua/calls.lua`: what each charged jobs request charged,
//! kept a short while in a sorted set of the seller's own
//! (`prefix:{seller}:calls`), so that the cancel of a call whose answer
//! was lost gives it back, or, sent before the call ran, makes it charge
//! nothing (a tombstone, in the field `tomb` of the seller's hash). State
//! v2 and v1+v2 only (a request whose block is the `block` field of the
//! seller's hash); v1 records nothing.

use std::collections::BTreeMap;

use crate::limiter::local::ModelStore;
use crate::limiter::script::{BlockRead, JobsRequest};

/// Records a trim keeps, the newest live ones (`CALLS_KEEP` of calls.lua).
pub const CALLS_KEEP: usize = 64;

/// Every this many records written, the set is trimmed (`CALLS_TRIM`), so
/// it never holds more than [`CALLS_KEEP`] + [`CALLS_TRIM`] - 1 records.
pub const CALLS_TRIM: u32 = 16;

/// Most bytes the field `tomb` keeps, in whole tombstones (`TOMB_BYTES`).
pub const TOMB_BYTES: usize = 512;

/// How long a record lives (µs) when the call does not say
/// (`CALL_LIFE_US` of calls.lua; `RedisStore` sends a few timeouts).
pub const CALL_LIFE_US: i128 = 5_000_000;

/// What the seller's hash holds for its records: the field `cn` (records
/// written since the last trim) and the field `tomb` (tombstones, oldest
/// first: call id and the cancel's µs instant).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallsFields {
    pub written: u32,
    pub tombs: Vec<(String, i128)>,
}

/// The sorted set of one seller's records: member `id,units` → its score,
/// the µs instant the call charged.
pub type Records = BTreeMap<String, i128>;

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

/// The seller's hash and the key of its records, when the request's block
/// is that hash's field.
///
/// # Panics
///
/// If such a request carries no records key: the script refuses it, and
/// the `Limiter` always sends one.
fn keys_of(q: &JobsRequest) -> Option<(&str, &str)> {
    (q.block.read == BlockRead::Field).then(|| {
        let calls = q
            .calls
            .as_deref()
            .expect("a request with block token 'f' or 'F' carries its calls key");
        (q.block.key.as_str(), calls)
    })
}

/// The length of a tombstone in the field: `;id,at`.
fn tomb_bytes((id, at): &(String, i128)) -> usize {
    2 + id.len() + at.to_string().len()
}

/// `tomb_find`: whether the first tombstone of `id` is younger than the life.
fn tomb_live(store: &ModelStore, hash: &str, id: &str, now: i128) -> bool {
    store
        .calls
        .get(hash)
        .and_then(|f| f.tombs.iter().find(|(t, _)| t == id))
        .is_some_and(|(_, at)| at + CALL_LIFE_US > now)
}

/// `tomb_write`: the stale tombstones at the front go, this one is
/// appended, then whole ones go from the front until the field holds at
/// most [`TOMB_BYTES`] (all are kept when the last alone is longer).
fn tomb_write(store: &mut ModelStore, hash: &str, now: i128, id: &str) {
    let list = &mut store.calls.entry(hash.to_owned()).or_default().tombs;
    let stale = list
        .iter()
        .position(|(_, at)| at + CALL_LIFE_US > now)
        .unwrap_or(list.len());
    list.drain(..stale);
    list.push((id.to_owned(), now));
    let mut total: usize = list.iter().map(tomb_bytes).sum();
    let last = list.last().map_or(0, tomb_bytes);
    if total > TOMB_BYTES && last <= TOMB_BYTES {
        let mut cut = 0;
        while total > TOMB_BYTES {
            total -= tomb_bytes(&list[cut]);
            cut += 1;
        }
        list.drain(..cut);
    }
}

/// `calls_write`: ZADD of the record, and every [`CALLS_TRIM`]-th write
/// the set cut to its newest [`CALLS_KEEP`] live records: everything at or
/// below the (KEEP+1)-th live score from the top goes (ties included), or
/// the stale ones when fewer are live.
fn write(store: &mut ModelStore, hash: &str, key: &str, now: i128, id: &str, units: i128) {
    let set = store.records.entry(key.to_owned()).or_default();
    set.insert(format!("{id},{units}"), now);
    let fields = store.calls.entry(hash.to_owned()).or_default();
    fields.written += 1;
    if fields.written >= CALLS_TRIM {
        let stale = now - CALL_LIFE_US;
        let mut live: Vec<i128> = set.values().copied().filter(|&s| s > stale).collect();
        live.sort_unstable_by(|a, b| b.cmp(a));
        let cut = live.get(CALLS_KEEP).copied().unwrap_or(stale);
        set.retain(|_, s| *s > cut);
        fields.written = 0;
    }
}

/// Whether a cancel came before this request ran (its tombstone is there).
pub(super) fn cancelled_before(store: &ModelStore, q: &JobsRequest, now: i128) -> bool {
    keys_of(q).is_some_and(|(hash, _)| tomb_live(store, hash, &q.call_id, now))
}

/// Records that the request charged `units` now.
pub(super) fn record(store: &mut ModelStore, q: &JobsRequest, now: i128, units: i128) {
    if let Some((hash, key)) = keys_of(q) {
        write(store, hash, key, now, &q.call_id, units);
    }
}

/// `calls_find`: the first live record of `id` in the set's order (score,
/// then member): its time, its units and its member.
fn find(store: &ModelStore, key: &str, id: &str, now: i128) -> Option<(i128, i128, String)> {
    let set = store.records.get(key)?;
    let prefix = format!("{id},");
    let mut live: Vec<(i128, &String)> = set
        .iter()
        .filter(|(_, &s)| s + CALL_LIFE_US > now)
        .map(|(m, &s)| (s, m))
        .collect();
    live.sort();
    live.into_iter().find_map(|(at, m)| {
        let units = m.strip_prefix(&prefix)?.parse().ok()?;
        Some((at, units, m.clone()))
    })
}

/// The record side of a cancel: the record goes and a tombstone is left;
/// the caller refunds what [`Cancelled::Refund`] names.
pub(super) fn cancel(store: &mut ModelStore, q: &JobsRequest, now: i128) -> Cancelled {
    let Some((hash, key)) = keys_of(q) else {
        return Cancelled::Nothing;
    };
    if tomb_live(store, hash, &q.call_id, now) {
        return Cancelled::Nothing;
    }
    let found = find(store, key, &q.call_id, now);
    if let Some((_, _, member)) = &found {
        if let Some(set) = store.records.get_mut(key) {
            set.remove(member);
            if set.is_empty() {
                store.records.remove(key);
            }
        }
    }
    tomb_write(store, hash, now, &q.call_id);
    match found {
        Some((at, units, _)) => Cancelled::Refund { at, units },
        None => Cancelled::Tombstone,
    }
}

/// The records `key` holds (tests: the bound).
pub fn records<'a>(store: &'a ModelStore, key: &str) -> Option<&'a Records> {
    store.records.get(key)
}
