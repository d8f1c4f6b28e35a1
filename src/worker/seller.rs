//! One seller's jobs on this replica, and how its waiting jobs are read:
//! the heads it asks the limiter about, and the granted ones taken out.
//!
//! A seller is in one phase at a time: idle, asking the limiter, or
//! running a granted batch. Its fields are the scheduler's to change
//! ([`super::scheduler`]); this file only holds them and answers questions
//! about them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::kafka::consumer::Origin;
use crate::limiter::BatchGranted;

use super::pending::Pending;
use super::pool::Slots;
use super::waits::HeldBy;

/// How deep into a seller's queue to look for the next job of each
/// partition; bounds the work per limiter call for a seller with a deep
/// backlog on few partitions.
const HEAD_SCAN: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Asking,
    Running,
}

/// One seller's jobs on this replica.
#[derive(Debug)]
pub(super) struct Seller {
    /// Waiting for a permit, in arrival order.
    pub(super) queue: VecDeque<Pending>,
    /// Failed calls waiting out their backoff.
    pub(super) delayed: Vec<(Instant, Pending)>,
    pub(super) phase: Phase,
    /// Refused (by the limiter, a 429 or the failure policy) until then.
    pub(super) blocked_until: Option<Instant>,
    /// Downstream slots held for the limiter call under way: one per job
    /// asked about, handed to the granted jobs, the rest given back.
    pub(super) asking: Option<Slots>,
    /// In the capacity queue: ready to ask, but every slot is taken.
    pub(super) wants_capacity: bool,
    /// The jobs the limiter call under way asks about, in order. The answer
    /// is read against these, not against the queue, which may change
    /// meanwhile (a revoke, `unstick`): a "never" names the job it was
    /// about, and a grant takes only jobs that were asked for.
    pub(super) asked: Vec<Origin>,
    /// 429s in a row that named no useful wait (none, zero, a past date):
    /// each one backs off longer, so "Retry-After: 0" cannot loop.
    pub(super) throttles_in_a_row: u32,
    /// A pacer's granted jobs waiting for the instant their unit may go,
    /// earliest first. They hold no downstream slot while they wait.
    pub(super) paced: VecDeque<Paced>,
    /// Runs under way (a granted batch, or one paced job each).
    pub(super) runs: usize,
    /// In the paced queue: a paced job is due, but every slot is taken.
    pub(super) wants_paced_slot: bool,
    /// Held by an operator's pause since then (`None`: not paused, as far
    /// as the last look went).
    pub(super) paused_since: Option<Instant>,
    /// Its last hold is for a slot of its `max_in_flight` (every slot
    /// taken, fleet-wide): it waits for capacity, not for its limit.
    pub(super) in_flight_bound: bool,
    /// What `blocked_until` is for (a rule, a 429, ...), for the operator.
    pub(super) held_by: Option<HeldBy>,
    /// Its queue may hold a job that names a `priority` (set when one
    /// arrives, cleared by the look that finds none): its jobs are then
    /// ranked over the whole queue ([`ranked_heads`]), else read in queue
    /// order within [`HEAD_SCAN`].
    pub(super) ranked: bool,
    /// The partition of each granted job not yet answered (called, or
    /// about to be): the seller may ask again while these run, but never
    /// for a job of one of these partitions, so one seller's jobs of a
    /// partition still reach the downstream one at a time, in order.
    pub(super) out: Vec<(Arc<str>, i32)>,
}

/// A granted job of a pacer (`leaky_bucket`), waiting for its go-at.
#[derive(Debug)]
pub(super) struct Paced {
    pub(super) go_at: Instant,
    /// Its unit's go-at on the limiter's clock (µs): its `X-Granted-At`.
    pub(super) granted_at_us: u64,
    pub(super) pending: Pending,
}

impl Seller {
    pub(super) fn new() -> Seller {
        Seller {
            queue: VecDeque::new(),
            delayed: Vec::new(),
            phase: Phase::Idle,
            blocked_until: None,
            asking: None,
            wants_capacity: false,
            asked: Vec::new(),
            throttles_in_a_row: 0,
            paced: VecDeque::new(),
            runs: 0,
            wants_paced_slot: false,
            paused_since: None,
            in_flight_bound: false,
            held_by: None,
            ranked: false,
            out: Vec::new(),
        }
    }

    /// Downstream slots it holds: its limiter call's, and its jobs out.
    pub(super) fn held(&self) -> usize {
        self.out.len() + self.asking.as_ref().map_or(0, Slots::len)
    }

    /// Whether, while its limiter call is under way, it has jobs waiting
    /// on partitions that call did not ask about and with no job out:
    /// what it could ask for next.
    pub(super) fn more_heads(&self) -> bool {
        let mut busy = self.out.clone();
        busy.extend(self.asked.iter().map(|o| (o.topic.clone(), o.partition)));
        !partition_heads(&self.queue, &busy, 1).is_empty()
    }

    /// A job of `origin`'s partition is out.
    pub(super) fn sent(&mut self, origin: &Origin) {
        self.out.push((origin.topic.clone(), origin.partition));
    }

    /// The job at `origin` is back (answered, or not called): its
    /// partition may be asked about again.
    pub(super) fn returned(&mut self, origin: &Origin) {
        let at = self
            .out
            .iter()
            .position(|(t, p)| *t == origin.topic && *p == origin.partition);
        debug_assert!(at.is_some(), "{origin:?} came back but was not out");
        if let Some(i) = at {
            self.out.swap_remove(i);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
            && self.delayed.is_empty()
            && self.paced.is_empty()
            && self.runs == 0
            && self.phase == Phase::Idle
            && !self.wants_capacity
    }

    /// Jobs waiting here: queued, backing off or paced.
    pub(super) fn waiting(&self) -> usize {
        self.queue.len() + self.delayed.len() + self.paced.len()
    }

    /// Running while a run is under way or a paced job waits; idle after.
    /// A limiter call under way keeps its seller asking: its answer holds
    /// the slots it reserved.
    pub(super) fn settle_phase(&mut self) {
        if self.phase == Phase::Asking {
            return;
        }
        self.phase = if self.runs > 0 || !self.paced.is_empty() {
            Phase::Running
        } else {
            Phase::Idle
        };
    }

    /// Moves the jobs whose backoff is over to the front of the queue,
    /// oldest first (they are older than the queue); returns when the next
    /// backoff ends.
    pub(super) fn wake_delayed(&mut self, now: Instant) -> Option<Instant> {
        let mut due: Vec<Pending> = Vec::new();
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                due.push(self.delayed.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        // swap_remove scrambled them.
        due.sort_by_key(|p| p.origin.offset);
        for p in due.into_iter().rev() {
            self.queue.push_front(p);
        }
        self.delayed.iter().map(|(t, _)| *t).min()
    }

    /// Keeps only the jobs `keep` accepts, returning the others' bytes.
    pub(super) fn retain(&mut self, keep: &dyn Fn(&Pending) -> bool) -> Vec<usize> {
        let mut dropped = Vec::new();
        self.queue
            .retain(|p| keep(p) || drop_bytes(&mut dropped, p));
        self.delayed
            .retain(|(_, p)| keep(p) || drop_bytes(&mut dropped, p));
        self.paced
            .retain(|q| keep(&q.pending) || drop_bytes(&mut dropped, &q.pending));
        self.settle_phase();
        dropped
    }
}

fn drop_bytes(dropped: &mut Vec<usize>, p: &Pending) -> bool {
    dropped.push(p.bytes);
    false
}

/// Indexes (ascending) of the first waiting job of each partition that
/// has no job `out` already, at most `max` of them. A seller asks the limiter for exactly these: each can be
/// called the moment it is granted (the jobs behind it in its partition
/// must wait for it, to keep their order), so a grant reaches the downstream
/// within one call of being made, and the downstream's view of the rate is
/// the limiter's.
pub(super) fn partition_heads(
    queue: &VecDeque<Pending>,
    out: &[(Arc<str>, i32)],
    max: usize,
) -> Vec<usize> {
    let mut seen: Vec<(&str, i32)> = out.iter().map(|(t, p)| (&**t, *p)).collect();
    let mut heads = Vec::new();
    for (i, p) in queue.iter().take(HEAD_SCAN).enumerate() {
        if heads.len() == max {
            break;
        }
        let part = (&*p.origin.topic, p.origin.partition);
        if !seen.contains(&part) {
            seen.push(part);
            heads.push(i);
        }
    }
    heads
}

/// How a seller's ready jobs are ordered when they name a `priority`:
/// highest first, each job raised one level per `aging` it has waited in
/// this replica, the earliest in the queue first among equals. So a job
/// overtakes the jobs of its partition of a lower priority, and no other:
/// jobs of one priority keep their offset order, and a bulk job that waited
/// long enough goes before new urgent ones (no starvation). One job per
/// partition is out at a time, as always.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rank {
    pub(super) now: Instant,
    pub(super) aging: Duration,
}

impl Rank {
    /// The job's priority now: its own, plus a level per `aging` waited.
    fn of(&self, p: &Pending) -> u64 {
        let waited = self.now.saturating_duration_since(p.received_at);
        let aged = waited.as_nanos() / self.aging.as_nanos().max(1);
        u64::from(p.job.priority).saturating_add(u64::try_from(aged).unwrap_or(u64::MAX))
    }
}

/// The jobs to ask about, at most `max`, one per partition with no job
/// out, for a seller whose queue may hold jobs that name a priority: each
/// partition's first job of the highest [`Rank`], the partitions' picks
/// ranked the same way. The whole queue is read, not [`HEAD_SCAN`] of it:
/// an urgent job behind a deep bulk backlog is the one that must be seen.
/// Also says whether any job still names a priority; when none does, the
/// picks are [`partition_heads`]' (every job 0: queue order is age order).
pub(super) fn ranked_heads(
    queue: &VecDeque<Pending>,
    out: &[(Arc<str>, i32)],
    max: usize,
    rank: Rank,
) -> (Vec<usize>, bool) {
    if !queue.iter().any(|p| p.job.priority > 0) {
        return (partition_heads(queue, out, max), false);
    }
    let busy: Vec<(&str, i32)> = out.iter().map(|(t, p)| (&**t, *p)).collect();
    // Per partition: its best job so far, as (rank, place in the queue).
    let mut best: Vec<((&str, i32), u64, usize)> = Vec::new();
    for (i, p) in queue.iter().enumerate() {
        let part = (&*p.origin.topic, p.origin.partition);
        if busy.contains(&part) {
            continue;
        }
        let r = rank.of(p);
        match best.iter_mut().find(|(q, _, _)| *q == part) {
            Some(b) if r > b.1 => (b.1, b.2) = (r, i),
            Some(_) => {}
            None => best.push((part, r, i)),
        }
    }
    best.sort_by_key(|&(_, r, i)| (std::cmp::Reverse(r), i));
    (
        best.into_iter().take(max).map(|(_, _, i)| i).collect(),
        true,
    )
}

/// Where the job at `origin` waits in `queue`: near the front for the
/// heads of [`partition_heads`], anywhere for a job that names a priority,
/// which [`ranked_heads`] may pick from deep in the queue.
pub(super) fn position(queue: &VecDeque<Pending>, origin: &Origin) -> Option<usize> {
    queue.iter().position(|p| p.origin == *origin)
}

/// Removes and returns the granted jobs, in the order asked, each with
/// its place in `asked`: the first `g.jobs` of `asked` that still wait (a
/// revoke or `unstick` between the question and the answer may have taken
/// some; their units go unused), never more units than were charged.
pub(super) fn take_granted(
    queue: &mut VecDeque<Pending>,
    g: &BatchGranted,
    asked: &[Origin],
) -> Vec<(usize, Pending)> {
    let mut units = 0u64;
    let mut out = Vec::new();
    for (k, origin) in asked.iter().take(g.jobs).enumerate() {
        let Some(i) = position(queue, origin) else {
            continue;
        };
        let cost = queue[i].job.cost;
        if units + cost > g.units {
            break;
        }
        units += cost;
        out.extend(queue.remove(i).map(|p| (k, p)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::local::granted;

    use super::super::fixtures::{origin, pending};

    fn queue(jobs: &[(i32, i64, u64)]) -> VecDeque<Pending> {
        jobs.iter()
            .map(|&(part, offset, cost)| pending("s", part, offset, cost))
            .collect()
    }

    #[test]
    fn the_heads_are_each_partitions_first_job_in_queue_order() {
        // (queue as (partition, offset), max, head indexes)
        type Jobs = &'static [(i32, i64, u64)];
        let cases: &[(Jobs, usize, &[usize])] = &[
            (&[(0, 1, 1), (0, 2, 1), (1, 3, 1)], 9, &[0, 2]),
            (&[(1, 1, 1), (0, 2, 1), (1, 3, 1), (2, 4, 1)], 9, &[0, 1, 3]),
            (&[(1, 1, 1), (0, 2, 1), (2, 4, 1)], 2, &[0, 1]),
            (&[], 9, &[]),
            (&[(0, 1, 1)], 0, &[]),
        ];
        for &(jobs, max, heads) in cases {
            assert_eq!(partition_heads(&queue(jobs), &[], max), heads, "{jobs:?}");
        }
    }

    /// Issue 36 part 5: a seller's highest priority goes first, past the
    /// lower ones of its partition and no others; a job that waited gains
    /// a level per `aging`, so bulk work never starves.
    #[test]
    fn heads_go_by_priority_raised_by_waiting() {
        let t0 = Instant::now();
        let aging = Duration::from_secs(30);
        // (partition, offset, priority, waited s)
        let build = |jobs: &[(i32, i64, u8, u64)]| -> VecDeque<Pending> {
            jobs.iter()
                .map(|&(part, offset, prio, waited)| {
                    let mut p = pending("s", part, offset, 1);
                    p.job.priority = prio;
                    p.received_at = t0 - Duration::from_secs(waited);
                    p
                })
                .collect()
        };
        let rank = Rank { now: t0, aging };
        // Bulk on partitions 0 and 1, an urgent job on 2: it goes first.
        let q = build(&[(0, 1, 0, 5), (1, 2, 0, 5), (2, 3, 5, 0)]);
        assert_eq!(ranked_heads(&q, &[], 9, rank).0, [2, 0, 1]);
        assert_eq!(ranked_heads(&q, &[], 1, rank).0, [2]);
        // An urgent job overtakes the bulk ones of its partition; jobs of
        // one priority keep their order.
        let q = build(&[(0, 1, 0, 5), (0, 2, 9, 0), (0, 3, 9, 0), (1, 4, 3, 0)]);
        assert_eq!(ranked_heads(&q, &[], 9, rank).0, [1, 3]);
        let q = build(&[(0, 1, 0, 5), (0, 2, 0, 5), (1, 3, 1, 0)]);
        assert_eq!(ranked_heads(&q, &[], 9, rank).0, [2, 0]);
        // A bulk job that waited 6 × 30 s (level 6) goes before a new 5.
        let q = build(&[(0, 1, 0, 180), (1, 2, 5, 0)]);
        assert_eq!(ranked_heads(&q, &[], 9, rank).0, [0, 1]);
        // No priorities at all: queue order, as before.
        let q = build(&[(1, 1, 0, 0), (0, 2, 0, 100)]);
        assert_eq!(ranked_heads(&q, &[], 9, rank).0, [0, 1]);
        // Deep behind a bulk backlog (past the 512 jobs read in queue
        // order), an urgent job is still seen.
        let mut jobs: Vec<(i32, i64, u8, u64)> = (0..600).map(|i| (0, i, 0, 1)).collect();
        jobs.push((1, 600, 5, 0));
        let q = build(&jobs);
        assert_eq!(ranked_heads(&q, &[], 1, rank), (vec![600], true));
        assert_eq!(position(&q, &q[600].origin), Some(600));
        // None left that names one: the flag clears.
        let q = build(&[(0, 1, 0, 0)]);
        assert_eq!(ranked_heads(&q, &[], 9, rank), (vec![0], false));
        // A partition with a job out is skipped whatever its priority.
        let q = build(&[(0, 1, 9, 0), (1, 2, 0, 0)]);
        let out = [(Arc::from("jobs"), 0)];
        assert_eq!(ranked_heads(&q, &out, 9, rank).0, [1]);
    }

    #[test]
    fn a_grant_takes_the_asked_jobs_still_waiting_within_its_units() {
        // (queue, asked offsets, granted jobs and units, taken as (place, offset))
        type Case = (
            &'static [(i32, i64, u64)],
            &'static [i64],
            (usize, u64),
            &'static [(usize, i64)],
        );
        let cases: &[Case] = &[
            (&[(0, 1, 1), (1, 2, 1)], &[1, 2], (2, 2), &[(0, 1), (1, 2)]),
            (&[(0, 1, 1), (1, 2, 1)], &[1, 2], (1, 1), &[(0, 1)]),
            // The first asked is gone (a revoke): its units go unused.
            (&[(1, 2, 1)], &[1, 2], (2, 2), &[(1, 2)]),
            // Never more units than were charged.
            (&[(0, 1, 2), (1, 2, 2)], &[1, 2], (2, 3), &[(0, 1)]),
            (&[(0, 1, 1)], &[1], (0, 0), &[]),
        ];
        for &(jobs, asked, (n, units), taken) in cases {
            let mut q = queue(jobs);
            let asked: Vec<Origin> = asked
                .iter()
                .map(|&o| {
                    jobs.iter()
                        .find(|j| j.1 == o)
                        .map_or(origin(0, o), |j| origin(j.0, o))
                })
                .collect();
            let got: Vec<(usize, i64)> = take_granted(&mut q, &granted(n, units), &asked)
                .into_iter()
                .map(|(k, p)| (k, p.origin.offset))
                .collect();
            assert_eq!(got, taken, "{jobs:?} granted {n}/{units}");
            assert_eq!(q.len(), jobs.len() - taken.len());
        }
    }

    #[test]
    fn the_phase_settles_on_what_is_under_way() {
        // (phase before, runs, paced waiting, phase after)
        let cases: &[(Phase, usize, bool, Phase)] = &[
            (Phase::Idle, 0, false, Phase::Idle),
            (Phase::Running, 0, false, Phase::Idle),
            (Phase::Idle, 1, false, Phase::Running),
            (Phase::Idle, 0, true, Phase::Running),
            (Phase::Asking, 0, false, Phase::Asking),
        ];
        for &(before, runs, paced, after) in cases {
            let mut s = Seller::new();
            s.phase = before;
            s.runs = runs;
            if paced {
                s.paced.push_back(Paced {
                    go_at: Instant::now(),
                    granted_at_us: 0,
                    pending: pending("s", 0, 1, 1),
                });
            }
            s.settle_phase();
            assert_eq!(s.phase, after, "{before:?} runs {runs} paced {paced}");
            assert_eq!(s.is_empty(), after == Phase::Idle && runs == 0 && !paced);
        }
    }
}
