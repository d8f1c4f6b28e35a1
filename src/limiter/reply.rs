//! The limiter script's raw reply, and its reading as a typed
//! [`BatchDecision`].
//!
//! Both the Redis glue and the reference model produce [`JobsReply`]s, so
//! the two can be compared field by field, and there is one place that
//! turns the script's integers into types.

use std::time::Duration;

use super::decision::{
    BatchDecision, BatchGranted, CannotPass, Denied, DeniedBy, Granted, NextJob, Pace,
};
use super::rule::Rule;

/// The first ten integers of a request's row in a jobs reply
/// (`lua/jobs.lua`), in order.
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

    /// `by` as an index into the rules sent (1-based on the wire).
    pub(crate) fn rule_index(&self) -> usize {
        (self.by.max(1) - 1) as usize
    }

    /// `by` as what refused: 0 is the downstream block.
    fn denied_by(&self) -> DeniedBy {
        if self.by == 0 {
            DeniedBy::DownstreamBlock
        } else {
            DeniedBy::Rule(self.rule_index())
        }
    }

    pub(crate) fn grant(&self, rules: &[Rule]) -> Granted {
        let pace =
            rules
                .iter()
                .filter_map(Rule::pace_interval_us)
                .max()
                .map(|interval_us| Pace {
                    first_at_us: self.go_at_us as u64,
                    first_after: Duration::from_micros(
                        self.go_at_us.saturating_sub(self.now_us) as u64
                    ),
                    interval_us,
                });
        Granted {
            granted: self.granted as u64,
            remaining: self.remaining as u64,
            reset_after: Duration::from_micros(self.reset_after_us as u64),
            pace,
            decided_at_us: self.now_us as u64,
        }
    }

    pub(crate) fn refusal(&self) -> Denied {
        Denied {
            retry_after: Duration::from_micros(self.retry_after_us as u64),
            remaining: self.remaining as u64,
            reset_after: Duration::from_micros(self.reset_after_us as u64),
            by: self.denied_by(),
            decided_at_us: self.now_us as u64,
        }
    }
}

pub(crate) fn cannot_pass(rules: &[Rule], rule: usize, cost: u64) -> CannotPass {
    let limit = rules.get(rule).copied();
    CannotPass {
        cost,
        capacity: limit.map_or(0, |r| r.capacity()),
        rule,
        limit,
    }
}

/// One request's reply to a jobs call (`lua/jobs.lua`): the ten fields of
/// [`Reply`] (`granted` = units, `by` = what stops the prefix) and three more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobsReply {
    pub head: Reply,
    /// Jobs granted, a prefix of the list.
    pub jobs: i64,
    /// What stops the prefix: 0 nothing, 1 the next job must wait, 2 it can
    /// never pass, 3 it waits for a slot of `max_in_flight`. A refusal says
    /// 1 or 3.
    pub next: i64,
    /// On a grant, the 1-based index of the rule whose `remaining` it is
    /// (the first of equals); 0 with no rules or on a refusal.
    pub tight: i64,
}

impl JobsReply {
    pub const LEN: usize = Reply::LEN + 3;

    /// One reply per request of the call, in order.
    pub fn many_from_slice(v: &[i64]) -> Result<Vec<JobsReply>, MalformedReply> {
        if v.is_empty() || v.len() % Self::LEN != 0 {
            return Err(MalformedReply(v.to_vec()));
        }
        v.chunks(Self::LEN)
            .map(|c| {
                let head = Reply::from_slice(&c[..Reply::LEN])?;
                let (jobs, next, tight) = (c[Reply::LEN], c[Reply::LEN + 1], c[Reply::LEN + 2]);
                if jobs < 0 || !(0..=3).contains(&next) || tight < 0 {
                    return Err(MalformedReply(c.to_vec()));
                }
                Ok(JobsReply {
                    head,
                    jobs,
                    next,
                    tight,
                })
            })
            .collect()
    }

    /// Reads the reply for a request over `rules` (in the order sent) and
    /// job `costs`.
    pub fn decision(&self, rules: &[Rule], costs: &[u64]) -> BatchDecision {
        let h = &self.head;
        let jobs = self.jobs as usize;
        let at = |j: usize| costs.get(j).copied().unwrap_or(0);
        let rule_index = h.rule_index();
        match h.status {
            1 => {
                let g = h.grant(rules);
                let next = match self.next {
                    1 => Some(NextJob::Wait {
                        retry_after: Duration::from_micros(h.retry_after_us as u64),
                        by: h.denied_by(),
                    }),
                    2 => Some(NextJob::Never(cannot_pass(rules, rule_index, at(jobs)))),
                    3 => Some(NextJob::Wait {
                        retry_after: Duration::from_micros(h.retry_after_us as u64),
                        by: DeniedBy::MaxInFlight,
                    }),
                    _ => None,
                };
                BatchDecision::Granted(BatchGranted {
                    jobs,
                    units: g.granted,
                    remaining: g.remaining,
                    tightest: (self.tight > 0 && (self.tight as usize) <= rules.len())
                        .then(|| self.tight as usize - 1),
                    reset_after: g.reset_after,
                    pace: g.pace,
                    decided_at_us: g.decided_at_us,
                    next,
                    leases: Vec::new(),
                    receipt: None,
                })
            }
            0 if self.next == 3 => BatchDecision::Denied(Denied {
                by: DeniedBy::MaxInFlight,
                ..h.refusal()
            }),
            0 => BatchDecision::Denied(h.refusal()),
            _ => BatchDecision::Never(cannot_pass(rules, rule_index, at(0))),
        }
    }
}

/// A jobs call's raw reply, read as the product reads it: the loss guard's
/// flag split off its end (when the call carried a guard), then one
/// [`JobsReply`] per request. Redis' glue and the simulation's embedded
/// Redis both read their replies here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsAnswer {
    /// One per request of the call, in order.
    pub replies: Vec<JobsReply>,
    /// What the call did with the loss guard's epoch: exactly one charging
    /// call per loss (or per new install) found it gone and wrote it.
    /// Always [`EpochFound::Kept`] without a guard.
    pub epoch: EpochFound,
}

/// What a guarded jobs call found of the epoch (`state_epoch` of
/// `lua/common.lua`): the reply's last integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EpochFound {
    /// There, or not needed (0).
    #[default]
    Kept,
    /// Gone: Redis lost the limiter's state, and this call wrote the
    /// epoch at its own time (1).
    Lost,
    /// Gone on a new install: this call wrote the epoch as "never lost"
    /// (2; the call said `+new`).
    NewInstall,
    /// A seller's state had gone back behind this replica's grants (a
    /// partial loss): this call found it, held the seller and listed the
    /// find for every replica's restore (3).
    RolledBack,
}

/// A partial loss as the rollbacks key lists it (`rollback_hold`,
/// `lua/common.lua`): a member `'<found µs> <point µs> <hash key>'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackFound {
    /// When the call found it.
    pub found_us: u64,
    /// The finder's own last grant as the state held it: the state went
    /// back to this instant or later.
    pub point_us: u64,
    /// The seller's hash.
    pub key: String,
}

impl RollbackFound {
    /// A member of the rollbacks key; `None` for one the script never
    /// writes.
    pub fn parse(member: &str) -> Option<RollbackFound> {
        let mut it = member.splitn(3, ' ');
        let found_us = it.next()?.parse().ok()?;
        let point_us = it.next()?.parse().ok()?;
        let key = it.next().filter(|k| !k.is_empty())?.to_owned();
        Some(RollbackFound {
            found_us,
            point_us,
            key,
        })
    }
}

impl EpochFound {
    /// The reply's flag, or `None` for an integer the script never sends.
    pub fn from_flag(flag: i64) -> Option<EpochFound> {
        match flag {
            0 => Some(EpochFound::Kept),
            1 => Some(EpochFound::Lost),
            2 => Some(EpochFound::NewInstall),
            3 => Some(EpochFound::RolledBack),
            _ => None,
        }
    }
}

impl JobsAnswer {
    /// Reads the reply of a call that carried a loss guard (`guarded`) or
    /// not; a flag other than 0, 1 or 2, or rows of the wrong shape, are
    /// malformed.
    pub fn from_slice(raw: &[i64], guarded: bool) -> Result<JobsAnswer, MalformedReply> {
        let (rows, epoch) = if guarded {
            let (rows, flag) = raw.split_at(raw.len().saturating_sub(1));
            match flag.first().copied().and_then(EpochFound::from_flag) {
                Some(epoch) => (rows, epoch),
                None => return Err(MalformedReply(raw.to_vec())),
            }
        } else {
            (raw, EpochFound::Kept)
        };
        Ok(JobsAnswer {
            replies: JobsReply::many_from_slice(rows)?,
            epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One jobs row: granted 2 jobs, 3 units, at 100 µs.
    fn row() -> Vec<i64> {
        vec![1, 3, 0, 0, 0, 100, 0, 0, 100, 1, 2, 0, 1]
    }

    /// Case 1: unguarded, every integer is a row. Cases 2 to 4: guarded,
    /// the last integer is the flag, 0, 1 or 2. Case 5: a flag of 3 is
    /// malformed. Case 6: a guarded reply without its flag leaves a short
    /// row, malformed.
    #[test]
    fn a_rollbacks_member_reads_back_and_anything_else_is_not_a_find() {
        assert_eq!(
            RollbackFound::parse("10 7 tw:{s}:v2"),
            Some(RollbackFound {
                found_us: 10,
                point_us: 7,
                key: "tw:{s}:v2".to_owned()
            })
        );
        for bad in ["", "10", "10 7", "10 7 ", "x 7 k", "10 y k"] {
            assert_eq!(RollbackFound::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_loss_guard_trailer_is_split_off_only_when_the_call_carried_one() {
        let one = JobsAnswer::from_slice(&row(), false).expect("1: a row");
        assert_eq!((one.replies.len(), one.epoch), (1, EpochFound::Kept), "1");
        for (n, flag, found) in [
            (2, 0, EpochFound::Kept),
            (3, 1, EpochFound::Lost),
            (4, 2, EpochFound::NewInstall),
            (5, 3, EpochFound::RolledBack),
        ] {
            let mut raw = row();
            raw.push(flag);
            let got = JobsAnswer::from_slice(&raw, true).unwrap_or_else(|e| panic!("{n}: {e}"));
            assert_eq!(
                (got.replies, got.epoch),
                (one.replies.clone(), found),
                "{n}"
            );
        }
        let mut raw = row();
        raw.push(4);
        assert!(JobsAnswer::from_slice(&raw, true).is_err(), "6: flag 4");
        assert!(
            JobsAnswer::from_slice(&row(), true).is_err(),
            "7: no trailer"
        );
    }
}
