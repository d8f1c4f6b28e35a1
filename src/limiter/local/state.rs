//! What each key of the scripts' keyspace holds, in memory: [`State`]
//! and the stored shape of each algorithm. The store (`store.rs`) keeps
//! them, the algorithm files read and write them; this file imports
//! neither.

use std::collections::{BTreeSet, HashMap};

/// What one Redis key holds. Each algorithm reads only its own variant and
/// treats any other as a missing key (rule keys carry the rule's
/// fingerprint, so one key never serves two algorithms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    FixedWindow(FixedWindowStored),
    SlidingWindowLog(Log),
    SlidingWindowCounter(SlidingWindowCounterStored),
    TokenBucket(TokenBucketStored),
    /// gcra: a theoretical arrival time `tat + f/limit`.
    Tat(Tat),
    /// leaky_bucket: the TAT at which the queue drains, and the call that
    /// queued last (hash `{ tat, f, id }`).
    Queue(Tat, String),
    BurstFill(BurstFillStored),
    /// The downstream block: the µs instant it ends.
    Block(i128),
}

/// A TAT stored exactly as whole µs and a remainder in 1/limit µs
/// (hash `{ tat, f }`); invariant `0 <= f < limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tat {
    pub tat: i128,
    pub f: i128,
}

/// Hash `{ w, n }`: the window start (µs) and the count taken in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowStored {
    pub w: i128,
    pub n: i128,
}

/// Hash `{ s, n }`: the period's start (µs) and the tokens left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstFillStored {
    pub s: i128,
    pub n: i128,
}

/// Hash `{ w, cur, prev }`: the window start of `cur`, its count, and the
/// count of the window before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowCounterStored {
    pub w: i128,
    pub cur: i128,
    pub prev: i128,
}

/// Hash `{ c, ts }`: `tokens * period` at time `ts` (µs);
/// invariant `0 <= c <= burst * period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketStored {
    pub c: i128,
    pub ts: i128,
}

/// A Redis sorted set: score (µs) per member, ordered by (score, member).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// Member → score; the same pairs as `ordered`.
    scores: HashMap<String, i128>,
    ordered: BTreeSet<(i128, String)>,
}

impl Log {
    /// `ZADD`: a member already present moves to the new score.
    pub fn add(&mut self, score: i128, member: String) {
        if let Some(old) = self.scores.insert(member.clone(), score) {
            self.ordered.remove(&(old, member.clone()));
        }
        self.ordered.insert((score, member));
    }

    /// `ZREM` of one member.
    pub fn remove(&mut self, member: &str) {
        if let Some(score) = self.scores.remove(member) {
            self.ordered.remove(&(score, member.to_owned()));
        }
    }

    /// Removes up to `n` entries of score `score` (the script's log names
    /// no calls: entries of one instant are interchangeable).
    pub fn remove_at(&mut self, score: i128, n: i128) {
        let members: Vec<String> = self
            .ordered
            .range((score, String::new())..)
            .take_while(|(s, _)| *s == score)
            .take(usize::try_from(n.max(0)).unwrap_or(usize::MAX))
            .map(|(_, m)| m.clone())
            .collect();
        for m in members {
            self.remove(&m);
        }
    }

    /// `ZREMRANGEBYSCORE -inf max`.
    pub fn remove_up_to(&mut self, max: i128) {
        while let Some((score, member)) = self.ordered.first().cloned() {
            if score > max {
                break;
            }
            self.ordered.pop_first();
            self.scores.remove(&member);
        }
    }

    /// Scores above `lo` (exclusive), ascending.
    pub fn scores_above(&self, lo: i128) -> impl Iterator<Item = i128> + '_ {
        self.ordered
            .iter()
            .map(|(score, _)| *score)
            .filter(move |&score| score > lo)
    }

    pub fn len(&self) -> usize {
        self.ordered.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }
}
