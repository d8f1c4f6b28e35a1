//! The limiter script's raw reply, and its reading as a typed [`Decision`].
//!
//! Both the Redis glue and the reference models produce a [`Reply`], so the
//! two can be compared field by field, and there is one place that turns the
//! script's integers into types.

use std::time::Duration;

use super::decision::{CannotPass, Decision, Denied, DeniedBy, Granted, Pace};
use super::rule::{Algorithm, Rule};

/// The ten integers `lua/limiter.lua` returns, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// 1 granted, 0 denied, -1 never.
    pub status: i64,
    pub granted: i64,
    pub remaining: i64,
    /// Rounded up to whole milliseconds.
    pub retry_after_ms: i64,
    /// Rounded up to whole milliseconds.
    pub reset_after_ms: i64,
    /// When the first granted unit may go (µs since the epoch); `now_us` unless a pacer took part.
    pub go_at_us: i64,
    pub retry_after_us: i64,
    pub reset_after_us: i64,
    /// The time the script decided at, from Redis' clock or the caller's.
    pub now_us: i64,
    /// 1-based index of the refusing rule (0: downstream block); on a grant,
    /// the rule with the fewest units left.
    pub by: i64,
}

/// A reply whose shape the script never produces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed limiter reply {0:?}")]
pub struct MalformedReply(pub Vec<i64>);

impl Reply {
    pub const LEN: usize = 10;

    pub fn from_slice(v: &[i64]) -> Result<Reply, MalformedReply> {
        if v.len() != Self::LEN || !(-1..=1).contains(&v[0]) || v.iter().skip(1).any(|&x| x < 0) {
            return Err(MalformedReply(v.to_vec()));
        }
        Ok(Reply {
            status: v[0],
            granted: v[1],
            remaining: v[2],
            retry_after_ms: v[3],
            reset_after_ms: v[4],
            go_at_us: v[5],
            retry_after_us: v[6],
            reset_after_us: v[7],
            now_us: v[8],
            by: v[9],
        })
    }

    /// Reads the reply for a call over `rules` (in the order they were sent)
    /// with `cost`.
    pub fn decision(&self, rules: &[Rule], cost: u64) -> Decision {
        let rule_index = |by: i64| (by.max(1) - 1) as usize;
        match self.status {
            1 => {
                let pace = rules
                    .iter()
                    .filter(|r| r.algorithm() == Algorithm::LeakyBucket)
                    .map(|r| r.period_us().div_ceil(r.limit().get()))
                    .max()
                    .map(|interval_us| Pace {
                        first_at_us: self.go_at_us as u64,
                        first_after: Duration::from_micros(
                            self.go_at_us.saturating_sub(self.now_us) as u64,
                        ),
                        interval_us,
                    });
                Decision::Granted(Granted {
                    granted: self.granted as u64,
                    remaining: self.remaining as u64,
                    reset_after: Duration::from_micros(self.reset_after_us as u64),
                    pace,
                    decided_at_us: self.now_us as u64,
                })
            }
            0 => Decision::Denied(Denied {
                retry_after: Duration::from_micros(self.retry_after_us as u64),
                remaining: self.remaining as u64,
                reset_after: Duration::from_micros(self.reset_after_us as u64),
                by: if self.by == 0 {
                    DeniedBy::DownstreamBlock
                } else {
                    DeniedBy::Rule(rule_index(self.by))
                },
                decided_at_us: self.now_us as u64,
            }),
            _ => {
                let rule = rule_index(self.by);
                Decision::Never(CannotPass {
                    cost,
                    capacity: rules.get(rule).map_or(0, |r| r.capacity()),
                    rule,
                })
            }
        }
    }
}
