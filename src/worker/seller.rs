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

use super::ordering::{Lane, LaneMap, LaneSet};
use super::pending::Pending;
use super::pool::Slots;
use super::waits::{HeldBy, Seen};

/// How deep into a seller's queue to look for the next job of each
/// lane; bounds the work per limiter call for a seller with a deep
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
    /// The lanes of the jobs in `asked`.
    pub(super) asked_lanes: Vec<Lane>,
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
    /// The lane of each granted job not yet answered (called, or about to
    /// be): the seller may ask again while these run, but never for a job
    /// of one of these lanes, so a lane's jobs reach the downstream one at
    /// a time, in order.
    pub(super) out: Vec<Lane>,
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
            asked_lanes: Vec::new(),
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

    /// What it may not ask about now: lanes with a job out, and the jobs
    /// behind one that waits out a backoff in their lane.
    pub(super) fn busy(&self) -> Busy {
        let mut busy = Busy {
            out: self.out.iter().copied().collect(),
            backing_off: LaneMap::default(),
        };
        for (_, p) in &self.delayed {
            let offset = p.original.origin.offset;
            let first = busy.backing_off.entry(p.lane).or_insert(offset);
            *first = (*first).min(offset);
        }
        busy
    }

    /// Whether, while its limiter call is under way, it has jobs waiting
    /// in lanes that call did not ask about and that are not busy: what it
    /// could ask for next.
    pub(super) fn more_heads(&self) -> bool {
        let mut busy = self.busy();
        busy.out.extend(self.asked_lanes.iter().copied());
        !lane_heads(&self.queue, &busy, 1).is_empty()
    }

    /// A job of `lane` is out.
    pub(super) fn sent(&mut self, lane: Lane) {
        debug_assert!(!self.out.contains(&lane), "two jobs of {lane:?} out");
        self.out.push(lane);
    }

    /// The job of `lane` out is back (answered, or not called): its lane
    /// may be asked about again.
    pub(super) fn returned(&mut self, lane: Lane) {
        let at = self.out.iter().position(|l| *l == lane);
        debug_assert!(at.is_some(), "{lane:?} came back but was not out");
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

/// What a seller may not ask about now ([`Seller::busy`]).
#[derive(Debug, Default)]
pub(super) struct Busy {
    /// Lanes with a job out (or asked about).
    pub(super) out: LaneSet,
    /// Per lane, the first (original) offset waiting out a backoff: the
    /// later jobs of the lane wait for it. (A lane is one original
    /// partition's, so its offsets compare.) Earlier ones, such as a
    /// retry-tier record held a moment, are not held back by it.
    pub(super) backing_off: LaneMap<i64>,
}

impl Busy {
    fn holds(&self, p: &Pending) -> bool {
        self.out.contains(&p.lane)
            || self
                .backing_off
                .get(&p.lane)
                .is_some_and(|&first| first < p.original.origin.offset)
    }
}

/// Indexes (ascending) of the first waiting job of each lane that `busy`
/// does not hold, at most `max` of them. A seller asks the limiter for exactly these: each can be called
/// the moment it is granted (the jobs behind it in its lane must wait for
/// it, to keep their order), so a grant reaches the downstream within one
/// call of being made, and the downstream's view of the rate is the
/// limiter's.
pub(super) fn lane_heads(queue: &VecDeque<Pending>, busy: &Busy, max: usize) -> Vec<usize> {
    let mut seen = LaneSet::default();
    let mut heads = Vec::new();
    for (i, p) in queue.iter().take(HEAD_SCAN).enumerate() {
        if heads.len() == max {
            break;
        }
        // A lane's first job here decides for the lane: held, or its head.
        if seen.insert(p.lane) && !busy.holds(p) {
            heads.push(i);
        }
    }
    heads
}

/// How a seller's ready jobs are ordered when they name a `priority`:
/// highest first, each job raised one level per `aging` it has waited in
/// this replica, the earliest in the queue first among equals. Priority
/// ranks lanes, never the jobs within one: a lane's first job goes first,
/// carrying the rank of the most urgent job of its lane (which waits for
/// it). So an urgent job overtakes the jobs of other lanes, and a bulk job
/// that waited long enough goes before new urgent ones (no starvation).
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

/// The jobs to ask about, at most `max`, one per lane not `busy`, for a
/// seller whose queue may hold jobs that name a priority: each lane's
/// first job, the lanes ranked by their most urgent job ([`Rank`]). The
/// whole queue is read, not [`HEAD_SCAN`] of it: an urgent job behind a
/// deep bulk backlog is the one that must be seen. Also says whether any
/// job still names a priority; when none does, the picks are
/// [`lane_heads`]' (every job 0: queue order is age order).
pub(super) fn ranked_heads(
    queue: &VecDeque<Pending>,
    busy: &Busy,
    max: usize,
    rank: Rank,
) -> (Vec<usize>, bool) {
    if !queue.iter().any(|p| p.job.priority > 0) {
        return (lane_heads(queue, busy, max), false);
    }
    // Per lane: its first job's place (none: held), and the best rank in
    // it so far.
    let mut lanes: LaneMap<(Option<usize>, u64)> = LaneMap::default();
    for (i, p) in queue.iter().enumerate() {
        let r = rank.of(p);
        lanes
            .entry(p.lane)
            .and_modify(|b| b.1 = b.1.max(r))
            .or_insert(((!busy.holds(p)).then_some(i), r));
    }
    let mut best: Vec<(usize, u64)> = lanes
        .into_values()
        .filter_map(|(i, r)| Some((i?, r)))
        .collect();
    best.sort_by_key(|&(i, r)| (std::cmp::Reverse(r), i));
    (best.into_iter().take(max).map(|(i, _)| i).collect(), true)
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

/// What the wait report and the backlog gauge read of a seller.
impl Seller {
    /// This seller (`key`) as the wait report reads it
    /// ([`super::waits`]).
    pub(super) fn seen(&self, key: &Arc<str>, now: Instant) -> Seen {
        let jobs = self
            .queue
            .iter()
            .chain(self.delayed.iter().map(|(_, p)| p))
            .chain(self.paced.iter().map(|q| &q.pending));
        let (mut units, mut oldest) = (0u64, None::<Instant>);
        for p in jobs {
            units = units.saturating_add(p.job.cost);
            oldest = Some(oldest.map_or(p.received_at, |o| o.min(p.received_at)));
        }
        let held = self.blocked_until.is_some_and(|t| t > now).then(|| {
            if self.paused_since.is_some() {
                HeldBy::Pause
            } else {
                self.held_by.unwrap_or(HeldBy::LimiterUnavailable)
            }
        });
        Seen {
            seller: key.clone(),
            jobs: self.waiting(),
            units,
            oldest,
            held,
            wants_slot: self.wants_capacity || self.wants_paced_slot,
        }
    }

    /// Its jobs waiting, by cause (see `Scheduler::waiting_by_cause`):
    /// its queue and backoffs under one cause, its pacer's jobs under
    /// "limit"; a cause with no job is left out.
    pub(super) fn waiting_by_cause(&self, now: Instant) -> Vec<(&'static str, i64)> {
        let mut out = Vec::new();
        let n = (self.queue.len() + self.delayed.len()) as i64;
        if n > 0 {
            let held = self.blocked_until.is_some_and(|t| t > now);
            let cause = if held && self.paused_since.is_some() {
                "paused"
            } else if held && !self.in_flight_bound {
                "limit"
            } else {
                "capacity"
            };
            out.push((cause, n));
        }
        if !self.paced.is_empty() {
            out.push(("limit", self.paced.len() as i64));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::local::granted;

    use super::super::fixtures::{lane, origin, pending};

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
            assert_eq!(
                lane_heads(&queue(jobs), &Busy::default(), max),
                heads,
                "{jobs:?}"
            );
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
        let none = Busy::default();
        // Bulk on partitions 0 and 1, an urgent job on 2: it goes first.
        let q = build(&[(0, 1, 0, 5), (1, 2, 0, 5), (2, 3, 5, 0)]);
        assert_eq!(ranked_heads(&q, &none, 9, rank).0, [2, 0, 1]);
        assert_eq!(ranked_heads(&q, &none, 1, rank).0, [2]);
        // An urgent job never overtakes the jobs of its own lane (here its
        // partition): it lends its rank to the lane's first job, which
        // goes first for it.
        let q = build(&[(0, 1, 0, 5), (0, 2, 9, 0), (0, 3, 9, 0), (1, 4, 3, 0)]);
        assert_eq!(ranked_heads(&q, &none, 9, rank).0, [0, 3]);
        // In lanes of their own (one product each), the urgent job goes
        // first, past the bulk ones of its partition.
        let mut q = build(&[(0, 1, 0, 5), (0, 2, 0, 5), (0, 3, 9, 0)]);
        for (p, key) in q.iter_mut().zip(["a", "a", "b"]) {
            p.lane = lane(0, key);
        }
        assert_eq!(ranked_heads(&q, &none, 9, rank).0, [2, 0]);
        let q = build(&[(0, 1, 0, 5), (0, 2, 0, 5), (1, 3, 1, 0)]);
        assert_eq!(ranked_heads(&q, &none, 9, rank).0, [2, 0]);
        // A bulk job that waited 6 × 30 s (level 6) goes before a new 5.
        let q = build(&[(0, 1, 0, 180), (1, 2, 5, 0)]);
        assert_eq!(ranked_heads(&q, &none, 9, rank).0, [0, 1]);
        // No priorities at all: queue order, as before.
        let q = build(&[(1, 1, 0, 0), (0, 2, 0, 100)]);
        assert_eq!(ranked_heads(&q, &none, 9, rank).0, [0, 1]);
        // Deep behind a bulk backlog (past the 512 jobs read in queue
        // order), an urgent job is still seen.
        let mut jobs: Vec<(i32, i64, u8, u64)> = (0..600).map(|i| (0, i, 0, 1)).collect();
        jobs.push((1, 600, 5, 0));
        let q = build(&jobs);
        assert_eq!(ranked_heads(&q, &none, 1, rank), (vec![600], true));
        assert_eq!(position(&q, &q[600].origin), Some(600));
        // None left that names one: the flag clears.
        let q = build(&[(0, 1, 0, 0)]);
        assert_eq!(ranked_heads(&q, &none, 9, rank), (vec![0], false));
        // A lane with a job out is skipped whatever its priority.
        let q = build(&[(0, 1, 9, 0), (1, 2, 0, 0)]);
        let busy = Busy {
            out: [q[0].lane].into_iter().collect(),
            ..Busy::default()
        };
        assert_eq!(ranked_heads(&q, &busy, 9, rank).0, [1]);
    }

    /// Issue 50: the heads are each lane's first job; a lane with a job
    /// out or backing off has none, so a key's jobs go one at a time and in
    /// order, while other keys of the same partition go beside it.
    #[test]
    fn the_heads_are_each_lanes_first_job_and_busy_lanes_wait() {
        let keyed = |offset: i64, key: &str| {
            let mut p = pending("s", 0, offset, 1);
            p.lane = lane(0, key);
            p
        };
        let mut s = Seller::new();
        s.queue = ["a", "b", "a", "c", "b"]
            .iter()
            .zip(1..)
            .map(|(k, o)| keyed(o, k))
            .collect();
        assert_eq!(lane_heads(&s.queue, &s.busy(), 9), [0, 1, 3]);
        // "a" out: its next job waits; "b" and "c" go.
        s.sent(lane(0, "a"));
        assert_eq!(lane_heads(&s.queue, &s.busy(), 9), [1, 3]);
        s.returned(lane(0, "a"));
        // "b" backing off: its later job waits for it too; an earlier one
        // of its lane (a retry-tier record held a moment) does not.
        let b = s.queue.remove(1).unwrap();
        s.delayed.push((Instant::now(), b));
        assert_eq!(lane_heads(&s.queue, &s.busy(), 9), [0, 2]);
        s.queue.push_front(keyed(0, "b"));
        assert_eq!(lane_heads(&s.queue, &s.busy(), 9), [0, 1, 3]);
        s.queue.pop_front();
        // While asking about "a" and "c", nothing else may be asked for.
        s.asked_lanes = vec![lane(0, "a"), lane(0, "c")];
        assert!(!s.more_heads());
        s.delayed.clear();
        assert!(s.more_heads());
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
