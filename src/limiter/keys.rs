//! Redis key names.
//!
//! Every key of one seller carries the seller in one hash tag (`{…}`), so a
//! Redis Cluster puts all of them in one slot and one script can touch them
//! all.
//!
//! The limiter's state is one hash per seller, `prefix:{seller}:v2`,
//! holding the 429 block and every rule's state by its place in the
//! seller's rule list (`r<i>` enforced, `s<i>` shadow); the global rules in
//! `prefix:{*global*}:v2`. An edited rule converts what it finds at its
//! place (`lua/common.lua`, `settle`), and a slot migration moves a seller
//! whole. Beside it, with `max_in_flight`, `prefix:{seller}:slots`. (The
//! `v2` in the name is the layout's name from before it was the only one;
//! the name stays so that state written under it is read.)

use std::sync::OnceLock;

use crate::config::Topology;

use super::rule::Rule;
use super::script::{BlockAt, BlockRead, KeyedRule, StateKey};

/// Key names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    /// Validated by config: contains no `{` or `}`.
    prefix: String,
}

/// The hash tag of the global rules, which belong to no seller. It cannot
/// collide with a seller's tag: seller tags are escaped and never contain `*`.
const GLOBAL_TAG: &str = "*global*";

impl KeySpace {
    pub fn new(prefix: impl Into<String>) -> KeySpace {
        KeySpace {
            prefix: prefix.into(),
        }
    }

    /// The hash that holds everything of one seller.
    pub fn seller_state(&self, seller: &str) -> String {
        format!("{}:{{{}}}:v2", self.prefix, tag(seller))
    }

    /// The sorted set of `seller`'s slots of `max_in_flight` (see
    /// `lua/slots.lua`).
    pub fn slots(&self, seller: &str) -> String {
        format!("{}:{{{}}}:slots", self.prefix, tag(seller))
    }

    /// The hash of the global rules' state.
    pub fn global_state(&self) -> String {
        format!("{}:{{{}}}:v2", self.prefix, GLOBAL_TAG)
    }

    /// Where a call finds the seller's 429 block: the `block` field of its
    /// hash.
    pub fn block_at(&self, seller: &str) -> BlockAt {
        BlockAt::new(self.seller_state(seller), BlockRead::Field)
    }

    /// The first key of a call over the seller's rules that must not see
    /// its 429 block (shadow rules, `limits show`'s reads of one rule).
    pub fn unblocked_at(&self, seller: &str) -> BlockAt {
        BlockAt::new(self.seller_state(seller), BlockRead::Ignore)
    }

    /// The first key of a call over the global rules alone (Redis Cluster).
    pub fn global_block_at(&self) -> BlockAt {
        BlockAt::new(self.global_state(), BlockRead::Ignore)
    }

    /// The seller's enforced rules with where their state lives.
    pub fn own_rules(&self, seller: &str, rules: &[Rule]) -> Vec<KeyedRule> {
        placed(rules, "r", self.seller_state(seller))
    }

    /// The seller's shadow rules with where their state lives.
    pub fn shadow_rules(&self, seller: &str, rules: &[Rule]) -> Vec<KeyedRule> {
        placed(rules, "s", self.seller_state(seller))
    }

    /// The global enforced rules with where their state lives.
    pub fn global_rules(&self, rules: &[Rule]) -> Vec<KeyedRule> {
        placed(rules, "r", self.global_state())
    }

    /// The global shadow rules with where their state lives.
    pub fn global_shadow_rules(&self, rules: &[Rule]) -> Vec<KeyedRule> {
        placed(rules, "s", self.global_state())
    }

    /// The hash of temporary overrides: one field per seller.
    pub fn overrides(&self) -> String {
        format!("{}:{{overrides}}", self.prefix)
    }

    /// The hash of operators' pauses: a field per paused seller and one
    /// for the whole fleet (see [`super::pauses`]).
    pub fn pauses(&self) -> String {
        format!("{}:{{pauses}}", self.prefix)
    }

    /// The wait board: one field per replica, its sellers' waits (see
    /// [`super::waits`]).
    pub fn waits(&self) -> String {
        format!("{}:{{waits}}", self.prefix)
    }

    /// The epoch of the limiter's state (`lua/jobs.lua`): a key without a
    /// TTL that every guarded jobs call reads, so that only a loss of
    /// Redis' data removes it. One for a single server; in a cluster one
    /// per hash slot, in the slot of `key` (any key of the call), since a
    /// script touches one slot and each master loses its own data.
    pub fn epoch(&self, topology: Topology, key: &str) -> String {
        match topology {
            Topology::Single => format!("{}:{{epoch}}", self.prefix),
            Topology::Cluster => {
                format!("{}:{{{}}}:epoch", self.prefix, slot_tag(slot_of(key)))
            }
        }
    }

    /// Every hash slot's epoch key (Redis Cluster): a new install writes
    /// them all ([`Limiter::begin_install`](super::Limiter::begin_install)).
    pub fn slot_epochs(&self) -> impl Iterator<Item = String> + '_ {
        (0..SLOTS).map(|slot| format!("{}:{{{}}}:epoch", self.prefix, slot_tag(slot)))
    }

    /// Where a call that finds a seller's state gone back (a partial
    /// loss, `rollback_hold` in `lua/common.lua`) lists the find for every
    /// replica to restore its part: a sorted set by the find's instant, in
    /// the epoch's slot (single topology only).
    pub fn rollbacks(&self) -> String {
        format!("{}:{{epoch}}:rolled", self.prefix)
    }

    /// The run id of the Redis process the limiter last ran on, and the
    /// last find of a move (`server_moved` in `lua/common.lua`): a
    /// failover or a restart that loaded an older save took every key
    /// back together, which no mark in them can tell. In the epoch's slot
    /// (single topology only).
    pub fn server(&self) -> String {
        format!("{}:{{epoch}}:server", self.prefix)
    }

    /// What `dlq replay` has replayed from dead-letter topic `topic`: a
    /// hash of `partition:offset` → marker (one key: a replay is one
    /// client's sequential work, never hot).
    pub fn dlq_replay(&self, topic: &str) -> String {
        format!("{}:{{dlq-replay}}:{topic}", self.prefix)
    }
}

/// Each rule at its place (`{kind}{i}`) in `hash`.
fn placed(rules: &[Rule], kind: &str, hash: String) -> Vec<KeyedRule> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| (StateKey::new(hash.clone(), format!("{kind}{i}")), *r))
        .collect()
}

/// Escapes a seller id so that it is exactly one hash tag: `{`, `}`, `%` and
/// `*` are percent-encoded (`}` would end the tag early, `*` is reserved for
/// the global tag). An empty id never reaches here: jobs without a seller are
/// dead-lettered.
fn tag(seller: &str) -> std::borrow::Cow<'_, str> {
    if !seller.contains(['{', '}', '%', '*']) {
        return seller.into();
    }
    let mut out = String::with_capacity(seller.len() + 8);
    for c in seller.chars() {
        match c {
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '%' => out.push_str("%25"),
            '*' => out.push_str("%2A"),
            c => out.push(c),
        }
    }
    out.into()
}

/// Redis Cluster's hash slot of `key`: CRC16 (XMODEM) of its hash tag,
/// modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).as_bytes()) % SLOTS
}

const SLOTS: u16 = 16384;

/// A short hash tag in `slot`: the first of `e0`, `e1`, … that hashes
/// there, found once for all slots (about 160,000 hashes, a few ms).
fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut left = tags.len();
        let mut n = 0u64;
        while left > 0 {
            let tag = format!("e{n}");
            let at = &mut tags[usize::from(slot_of(&tag))];
            if at.is_empty() {
                *at = tag;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot)]
}

/// The hash tag Redis Cluster would use for `key`: the part between the
/// first `{` and the next `}`, when non-empty; else the whole key.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_keys_of_a_seller_share_one_tag_even_with_braces_in_the_id() {
        let ks = KeySpace::new("tw");
        for seller in ["s1", "a{b}c", "}", "{", "%7B", "*global*", "sel ler"] {
            let tag = hash_tag(&ks.seller_state(seller)).to_owned();
            assert_eq!(hash_tag(&ks.slots(seller)), tag, "seller {seller:?}");
            assert_ne!(
                tag, GLOBAL_TAG,
                "seller {seller:?} must not share the global tag"
            );
        }
        assert_ne!(
            hash_tag(&ks.seller_state("{")),
            hash_tag(&ks.seller_state("%7B"))
        );
    }

    #[test]
    fn a_cluster_epoch_lies_in_the_slot_of_the_call_and_a_single_one_is_shared() {
        let ks = KeySpace::new("tw");
        for seller in ["s1", "a{b}c", "seller-42", "", "*"] {
            let key = ks.seller_state(seller);
            let epoch = ks.epoch(Topology::Cluster, &key);
            assert_eq!(slot_of(&epoch), slot_of(&key), "seller {seller:?}: {epoch}");
            assert!(epoch.starts_with("tw:{e") && epoch.ends_with("}:epoch"));
            assert_eq!(ks.epoch(Topology::Single, &key), "tw:{epoch}");
        }
        // The slots Redis documents (CLUSTER KEYSLOT).
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
    }
}
