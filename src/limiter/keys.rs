//! Redis key names, in the two layouts of the limiter's state.
//!
//! Every key of one seller carries the seller in one hash tag (`{…}`), so a
//! Redis Cluster puts all of them in one slot and one script can touch them
//! all.
//!
//! - **v1**: a key per rule whose name includes the rule's fingerprint, and
//!   a key for the 429 block. An edited rule starts from fresh state, on
//!   top of what the old rule admitted (issue 21).
//! - **v2**: one hash per seller, `prefix:{seller}:v2`, holding the block
//!   and every rule's state by its place in the seller's rule list
//!   (`r<i>` enforced, `s<i>` shadow); the global rules in
//!   `prefix:{*global*}:v2`. An edited rule converts what it finds at its
//!   place (`lua/common.lua`, `settle`), and a slot migration moves a
//!   seller whole. Beside it, `prefix:{seller}:calls`, the records of its
//!   charged jobs calls (`lua/calls.lua`), and with `max_in_flight`,
//!   `prefix:{seller}:slots`.

pub use crate::config::StateLayout;

use std::sync::OnceLock;

use crate::config::Topology;

use super::rule::Rule;
use super::script::{BlockAt, BlockRead, KeyedRule, StateKey};

/// Key names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    /// Validated by config: contains no `{` or `}`.
    prefix: String,
    layout: StateLayout,
}

/// The hash tag of the global rules, which belong to no seller. It cannot
/// collide with a seller's tag: seller tags are escaped and never contain `*`.
const GLOBAL_TAG: &str = "*global*";

impl KeySpace {
    /// Keys of state v1.
    pub fn new(prefix: impl Into<String>) -> KeySpace {
        KeySpace::with_layout(prefix, StateLayout::V1)
    }

    pub fn with_layout(prefix: impl Into<String>, layout: StateLayout) -> KeySpace {
        KeySpace {
            prefix: prefix.into(),
            layout,
        }
    }

    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// v2: the hash that holds everything of one seller.
    pub fn seller_state(&self, seller: &str) -> String {
        format!("{}:{{{}}}:v2", self.prefix, tag(seller))
    }

    /// The sorted set of `seller`'s slots of `max_in_flight` (every
    /// layout; see `lua/slots.lua`).
    pub fn slots(&self, seller: &str) -> String {
        format!("{}:{{{}}}:slots", self.prefix, tag(seller))
    }

    /// v2 and v1+v2: the sorted set where versions before issue 37 kept
    /// `seller`'s recent charged jobs calls for their cancel. The records
    /// now live in the field `rec` of the seller's hash (`lua/calls.lua`);
    /// the key still travels with every jobs call (one wire format across
    /// a rolling deploy) and `limits reset` still deletes it.
    pub fn calls(&self, seller: &str) -> String {
        format!("{}:{{{}}}:calls", self.prefix, tag(seller))
    }

    /// v2: the hash of the global rules' state.
    pub fn global_state(&self) -> String {
        format!("{}:{{{}}}:v2", self.prefix, GLOBAL_TAG)
    }

    /// Where a call finds the seller's 429 block.
    pub fn block_at(&self, seller: &str) -> BlockAt {
        self.block_of(self.seller_state(seller), BlockRead::Field, || {
            self.block(seller)
        })
    }

    /// The first key of a call over the seller's rules that must not see
    /// its 429 block (shadow rules, `limits show`'s reads of one rule).
    pub fn unblocked_at(&self, seller: &str) -> BlockAt {
        self.block_of(self.seller_state(seller), BlockRead::Ignore, || {
            self.no_block(seller)
        })
    }

    /// The first key of a call over the global rules alone (Redis Cluster).
    pub fn global_block_at(&self) -> BlockAt {
        self.block_of(self.global_state(), BlockRead::Ignore, || {
            self.global_block()
        })
    }

    /// v1: the key `v1` names, read as a block key (never set for the
    /// unblocked and global ones); v2: the hash, read as `read` says;
    /// v1+v2: both.
    fn block_of(&self, hash: String, read: BlockRead, v1: impl Fn() -> String) -> BlockAt {
        match self.layout {
            StateLayout::V1 => BlockAt::key(v1()),
            StateLayout::V2 => BlockAt {
                key: hash,
                read,
                also: None,
            },
            StateLayout::V1V2 => BlockAt {
                key: hash,
                read,
                also: Some(v1()),
            },
        }
    }

    /// The seller's enforced rules with where their state lives.
    pub fn own_rules(&self, seller: &str, rules: &[Rule]) -> Vec<KeyedRule> {
        self.placed(
            rules,
            "r",
            || self.seller_state(seller),
            |r| self.rule(seller, r),
        )
    }

    /// The seller's shadow rules with where their state lives.
    pub fn shadow_rules(&self, seller: &str, rules: &[Rule]) -> Vec<KeyedRule> {
        self.placed(
            rules,
            "s",
            || self.seller_state(seller),
            |r| self.rule(seller, r),
        )
    }

    /// The global enforced rules with where their state lives.
    pub fn global_rules(&self, rules: &[Rule]) -> Vec<KeyedRule> {
        self.placed(rules, "r", || self.global_state(), |r| self.global_rule(r))
    }

    /// The global shadow rules with where their state lives.
    pub fn global_shadow_rules(&self, rules: &[Rule]) -> Vec<KeyedRule> {
        self.placed(rules, "s", || self.global_state(), |r| self.global_rule(r))
    }

    fn placed(
        &self,
        rules: &[Rule],
        kind: &str,
        hash: impl Fn() -> String,
        own_key: impl Fn(&Rule) -> String,
    ) -> Vec<KeyedRule> {
        match self.layout {
            StateLayout::V1 => rules
                .iter()
                .map(|r| (StateKey::own(own_key(r)), *r))
                .collect(),
            StateLayout::V1V2 => {
                let key = hash();
                rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        (
                            StateKey::both(key.clone(), format!("{kind}{i}"), own_key(r)),
                            *r,
                        )
                    })
                    .collect()
            }
            StateLayout::V2 => {
                let key = hash();
                rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (StateKey::place(key.clone(), format!("{kind}{i}")), *r))
                    .collect()
            }
        }
    }

    /// v1: where a downstream 429 holds a seller for every replica.
    pub fn block(&self, seller: &str) -> String {
        format!("{}:{{{}}}:block", self.prefix, tag(seller))
    }

    /// A key in the seller's hash slot that nothing writes: the block key
    /// of calls that must not see a 429 block (shadow rules, the per-rule
    /// state `limits show` reads).
    pub fn no_block(&self, seller: &str) -> String {
        format!("{}:{{{}}}:unblocked", self.prefix, tag(seller))
    }

    /// v1: the state of one of a seller's rules.
    pub fn rule(&self, seller: &str, rule: &Rule) -> String {
        format!("{}:{{{}}}:{}", self.prefix, tag(seller), rule.fingerprint())
    }

    /// v1: the state of a global rule.
    pub fn global_rule(&self, rule: &Rule) -> String {
        format!("{}:{{{}}}:{}", self.prefix, GLOBAL_TAG, rule.fingerprint())
    }

    /// The block key that goes with global rules checked in a call of their
    /// own (Redis Cluster): never set, read as "not blocked".
    pub fn global_block(&self) -> String {
        format!("{}:{{{}}}:block", self.prefix, GLOBAL_TAG)
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

    /// What `dlq replay` has replayed from dead-letter topic `topic`: a
    /// hash of `partition:offset` → marker (one key: a replay is one
    /// client's sequential work, never hot).
    pub fn dlq_replay(&self, topic: &str) -> String {
        format!("{}:{{dlq-replay}}:{topic}", self.prefix)
    }
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
    use crate::limiter::Algorithm;
    use std::time::Duration;

    #[test]
    fn all_keys_of_a_seller_share_one_tag_even_with_braces_in_the_id() {
        let ks = KeySpace::new("tw");
        let r = Rule::new(Algorithm::Gcra, 10, Duration::from_secs(1), Some(5)).unwrap();
        for seller in ["s1", "a{b}c", "}", "{", "%7B", "*global*", "sel ler"] {
            let tag = hash_tag(&ks.block(seller)).to_owned();
            assert_eq!(hash_tag(&ks.rule(seller, &r)), tag, "seller {seller:?}");
            assert_ne!(
                tag, GLOBAL_TAG,
                "seller {seller:?} must not share the global tag"
            );
        }
        assert_ne!(hash_tag(&ks.block("{")), hash_tag(&ks.block("%7B")));
    }

    #[test]
    fn a_cluster_epoch_lies_in_the_slot_of_the_call_and_a_single_one_is_shared() {
        let ks = KeySpace::with_layout("tw", StateLayout::V2);
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

    #[test]
    fn rule_keys_change_with_the_rule() {
        let ks = KeySpace::new("tw");
        let a = Rule::new(Algorithm::Gcra, 10, Duration::from_secs(1), None).unwrap();
        let b = Rule::new(Algorithm::Gcra, 11, Duration::from_secs(1), None).unwrap();
        assert_ne!(ks.rule("s", &a), ks.rule("s", &b));
        assert_eq!(ks.rule("s", &a), "tw:{s}:gcra:10:1000000:10");
    }
}
