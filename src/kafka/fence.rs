//! Fencing a stalled replica (issue 53, item 2): when a consumer may have
//! lost its place in the group, and when it has it again. Pure: every
//! method takes `now`, and says what changed; [`super::session`] holds one
//! per consumer, tells the change and makes the confirming commit.
//!
//! A consumer's assignment is only as good as its session with the group
//! coordinator. A process that stalls (a GC-like pause, a SIGSTOP, a
//! starved host) for longer than `session.timeout.ms` is expired by the
//! broker and its partitions go to other members; when it resumes, its
//! threads run again before librdkafka's heartbeat has told it so, and
//! would call jobs the new owners call too. So:
//!
//! - **Fenced** when the process gave no sign of life (a watchdog thread
//!   that does nothing else ticks; the poll thread too) for longer than
//!   [`Watch::stall_after`] (seen by whichever thread looks first: the
//!   engine's calls may run before the watchdog does), or when librdkafka
//!   says the assignment is lost.
//! - **Confirmed again** by a new assignment (the rebalance completed: the
//!   member is current), by a synchronous commit the coordinator accepted
//!   (it checks the member's generation), or, failing both, by ticks for a
//!   whole [`Watch::confirm_after`] with the assignment never lost:
//!   librdkafka declares the assignment lost itself when no heartbeat
//!   succeeds for `session.timeout.ms`, so a consumer that polls that long
//!   without losing it had a heartbeat accepted after it resumed. A lost
//!   assignment waits for the new one.
//!
//! A fence only stops calls from starting; calls already out finish (a
//! stall between the check and the send is not seen: nothing in a process
//! can see it).

use std::time::Duration;

use tokio::time::Instant;

/// How often a fenced consumer tries a confirming commit: often enough to
/// resume soon after a false alarm, rarely enough not to load a
/// coordinator that is refusing them.
pub const CONFIRM_EVERY: Duration = Duration::from_secs(1);

/// How a consumer watches its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    /// The consumer's role, for logs and metrics (`jobs`, `retries`).
    pub consumer: &'static str,
    /// A gap longer than this between two ticks may have cost the session:
    /// `session.timeout.ms` less `heartbeat.interval.ms`, because the last
    /// heartbeat before a stall may be that much older than the last tick.
    pub stall_after: Duration,
    /// `session.timeout.ms`: ticking this long after a fence without the
    /// assignment lost confirms it (see the module's doc).
    pub confirm_after: Duration,
}

/// Why a consumer fenced itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No tick for `gap`, longer than [`Watch::stall_after`].
    Stalled { gap: Duration },
    /// librdkafka says the assignment is lost (the session expired, the
    /// generation is stale).
    AssignmentLost,
}

impl Why {
    pub fn label(self) -> &'static str {
        match self {
            Why::Stalled { .. } => "stalled",
            Why::AssignmentLost => "assignment_lost",
        }
    }
}

/// What confirmed a fenced consumer's ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// A rebalance completed with this member in it.
    Assignment,
    /// The coordinator accepted a commit of this member's generation.
    Commit,
    /// A whole session timeout of ticks with the assignment never lost.
    Heartbeats,
}

impl By {
    pub fn label(self) -> &'static str {
        match self {
            By::Assignment => "assignment",
            By::Commit => "commit",
            By::Heartbeats => "heartbeats",
        }
    }
}

/// What a call changed, to be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Fenced(Why),
    Resumed { by: By, fenced_for: Duration },
}

#[derive(Debug, Clone, Copy)]
struct Fence {
    /// When it was found (at or after the stall's end).
    since: Instant,
    /// The assignment is lost: only a new one ends the fence.
    lost: bool,
    /// The last confirming commit tried.
    tried: Option<Instant>,
}

/// One consumer's fence. Unwatched (tools, tests, the simulation's
/// brokers), it only follows lost assignments.
#[derive(Debug, Default)]
pub struct Fencing {
    watch: Option<Watch>,
    /// The latest sign of life (the watchdog's, the poll thread's); none
    /// before the first.
    last_tick: Option<Instant>,
    /// What librdkafka last said of the assignment: a loss is acted on
    /// when it begins (a flag left set after the new assignment must not
    /// fence again).
    was_lost: bool,
    fence: Option<Fence>,
}

impl Fencing {
    pub fn new(watch: Option<Watch>) -> Fencing {
        Fencing {
            watch,
            ..Fencing::default()
        }
    }

    pub fn watch(&self) -> Option<Watch> {
        self.watch
    }

    /// Whether calls must not start at `now`. A process silent for longer
    /// than the stall bound fences here, from any thread.
    pub fn check(&mut self, now: Instant) -> (bool, Option<Change>) {
        let change = self.stall(now);
        (self.fence.is_some(), change)
    }

    /// The poll thread is alive at `now`, and librdkafka says the
    /// assignment is `lost` or not. May fence (a gap, a loss beginning) or
    /// resume (a whole session timeout of ticks since the fence).
    pub fn tick(&mut self, now: Instant, lost: bool) -> Option<Change> {
        let stalled = self.alive(now);
        let began = lost && !self.was_lost;
        self.was_lost = lost;
        if began {
            return self.lost(now).or(stalled);
        }
        if stalled.is_some() {
            return stalled;
        }
        let (watch, fence) = (self.watch?, self.fence?);
        if !fence.lost && now.saturating_duration_since(fence.since) >= watch.confirm_after {
            return self.resume(now, By::Heartbeats);
        }
        None
    }

    /// The process is alive at `now` (the watchdog's tick): says nothing of
    /// the assignment. May fence (a gap).
    pub fn alive(&mut self, now: Instant) -> Option<Change> {
        let stalled = self.stall(now);
        self.last_tick = Some(now);
        stalled
    }

    /// The assignment is lost (a revoke with librdkafka's lost flag, or the
    /// flag seen by a tick): fenced until a new assignment.
    pub fn lost(&mut self, now: Instant) -> Option<Change> {
        match &mut self.fence {
            // Fenced already (a stall found first): told once.
            Some(f) => {
                f.lost = true;
                None
            }
            None => {
                self.fence = Some(Fence {
                    since: now,
                    lost: true,
                    tried: None,
                });
                Some(Change::Fenced(Why::AssignmentLost))
            }
        }
    }

    /// Whether to try a confirming commit at `now` (fenced, the assignment
    /// not lost, none tried within [`CONFIRM_EVERY`]); notes the try.
    pub fn confirm_due(&mut self, now: Instant) -> bool {
        let Some(f) = &mut self.fence else {
            return false;
        };
        let due = !f.lost
            && f.tried
                .is_none_or(|t| now.saturating_duration_since(t) >= CONFIRM_EVERY);
        if due {
            f.tried = Some(now);
        }
        due
    }

    /// Ownership confirmed at `now` `by` a commit (ignored while the
    /// assignment is lost: that commit cannot have been accepted for it)
    /// or a new assignment.
    pub fn confirmed(&mut self, now: Instant, by: By) -> Option<Change> {
        match self.fence {
            Some(f) if f.lost && by != By::Assignment => None,
            Some(_) => self.resume(now, by),
            None => None,
        }
    }

    fn resume(&mut self, now: Instant, by: By) -> Option<Change> {
        let f = self.fence.take()?;
        Some(Change::Resumed {
            by,
            fenced_for: now.saturating_duration_since(f.since),
        })
    }

    /// Fences if the process has been silent too long at `now`; a
    /// fence already up starts again from `now` (a second stall).
    fn stall(&mut self, now: Instant) -> Option<Change> {
        let (watch, last) = (self.watch?, self.last_tick?);
        let gap = now.saturating_duration_since(last);
        if gap <= watch.stall_after {
            return None;
        }
        // Counted from here on, once: the next look sees no gap.
        self.last_tick = Some(now);
        match &mut self.fence {
            Some(f) => {
                f.since = now;
                None
            }
            None => {
                self.fence = Some(Fence {
                    since: now,
                    lost: false,
                    tried: None,
                });
                Some(Change::Fenced(Why::Stalled { gap }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn watched() -> Fencing {
        Fencing::new(Some(Watch {
            consumer: "jobs",
            stall_after: 42 * S,
            confirm_after: 45 * S,
        }))
    }

    /// A gap between ticks up to the bound is not a stall; one past it
    /// fences, once, and the tick after it finds no second gap.
    #[test]
    fn a_gap_past_the_bound_fences_once() {
        let t0 = Instant::now();
        let mut f = watched();
        // (gap since the last tick, fenced after it)
        let rows = [(0, false), (1, false), (42, false), (43, true), (1, true)];
        let mut t = t0;
        for (i, (gap, fenced)) in rows.into_iter().enumerate() {
            t += gap * S;
            let change = f.tick(t, false);
            assert_eq!(f.check(t).0, fenced, "row {i}: gap {gap}s");
            let want = (i == 3).then_some(Change::Fenced(Why::Stalled { gap: 43 * S }));
            assert_eq!(change, want, "row {i}: told when it begins only");
        }
    }

    /// The engine's call may run before the watchdog after a stall: a
    /// look from any thread at a silent watchdog fences.
    #[test]
    fn a_silent_process_fences_whoever_looks_first() {
        let t0 = Instant::now();
        let mut f = watched();
        assert_eq!(
            f.check(t0 + 100 * S),
            (false, None),
            "never ticked: not watched yet"
        );
        f.tick(t0, false);
        assert_eq!(f.check(t0 + 42 * S), (false, None));
        let (fenced, change) = f.check(t0 + 50 * S);
        assert!(fenced);
        assert_eq!(change, Some(Change::Fenced(Why::Stalled { gap: 50 * S })));
        // The watchdog wakes just after: the same stall, not told again.
        assert_eq!(f.tick(t0 + 50 * S + S / 10, false), None);
        assert!(f.check(t0 + 51 * S).0);
    }

    /// An unwatched consumer is never fenced by time; it still follows a
    /// lost assignment.
    #[test]
    fn an_unwatched_consumer_follows_only_losses() {
        let t0 = Instant::now();
        let mut f = Fencing::new(None);
        f.tick(t0, false);
        assert_eq!(f.tick(t0 + 1000 * S, false), None);
        assert!(!f.check(t0 + 2000 * S).0);
        assert_eq!(
            f.tick(t0 + 2001 * S, true),
            Some(Change::Fenced(Why::AssignmentLost))
        );
        assert!(f.check(t0 + 2001 * S).0);
    }

    /// What ends a fence, by what fenced it. Rows: (why, what comes, ends
    /// it). A lost assignment is ended by a new one only; a stall also by
    /// an accepted commit, or a session timeout of ticks with no loss.
    #[test]
    fn what_ends_a_fence() {
        #[derive(Debug, Clone, Copy)]
        enum Then {
            Assigned,
            Committed,
            /// Ticks every second for this many seconds, none lost.
            Ticks(u32),
            /// Ticks, and librdkafka says the assignment is lost at the
            /// first.
            TicksLost(u32),
        }
        let rows = [
            (
                Why::Stalled { gap: 60 * S },
                Then::Assigned,
                Some(By::Assignment),
            ),
            (
                Why::Stalled { gap: 60 * S },
                Then::Committed,
                Some(By::Commit),
            ),
            (Why::Stalled { gap: 60 * S }, Then::Ticks(44), None),
            (
                Why::Stalled { gap: 60 * S },
                Then::Ticks(45),
                Some(By::Heartbeats),
            ),
            (Why::Stalled { gap: 60 * S }, Then::TicksLost(100), None),
            (Why::AssignmentLost, Then::Assigned, Some(By::Assignment)),
            (Why::AssignmentLost, Then::Committed, None),
            (Why::AssignmentLost, Then::Ticks(100), None),
        ];
        for (i, (why, then, ends)) in rows.into_iter().enumerate() {
            let t0 = Instant::now();
            let mut f = watched();
            f.tick(t0, false);
            let at = match why {
                Why::Stalled { gap } => {
                    let at = t0 + gap;
                    assert_eq!(f.tick(at, false), Some(Change::Fenced(why)), "row {i}");
                    at
                }
                Why::AssignmentLost => {
                    assert_eq!(f.lost(t0), Some(Change::Fenced(why)), "row {i}");
                    t0
                }
            };
            let mut resumed = None;
            let mut last = at + S;
            match then {
                Then::Assigned => resumed = f.confirmed(last, By::Assignment),
                Then::Committed => resumed = f.confirmed(last, By::Commit),
                Then::Ticks(n) | Then::TicksLost(n) => {
                    for k in 1..=n {
                        last = at + k * S;
                        let lost = matches!(then, Then::TicksLost(_));
                        if let Some(c) = f.tick(last, lost) {
                            assert!(resumed.is_none(), "row {i}: resumed twice");
                            resumed = Some(c);
                        }
                    }
                }
            }
            let by = resumed.and_then(|c| match c {
                Change::Resumed { by, .. } => Some(by),
                Change::Fenced(_) => None,
            });
            assert_eq!(by, ends, "row {i}: {why:?} then {then:?}");
            assert_eq!(f.check(last + S).0, ends.is_none(), "row {i}: fenced after");
        }
    }

    /// librdkafka's lost flag may still read set after the new assignment:
    /// only its beginning fences.
    #[test]
    fn a_lost_flag_left_set_after_the_new_assignment_does_not_fence_again() {
        let t0 = Instant::now();
        let mut f = watched();
        f.tick(t0, false);
        assert_eq!(
            f.tick(t0 + S, true),
            Some(Change::Fenced(Why::AssignmentLost))
        );
        assert!(matches!(
            f.confirmed(t0 + 2 * S, By::Assignment),
            Some(Change::Resumed { by: By::Assignment, fenced_for }) if fenced_for == S
        ));
        assert_eq!(f.tick(t0 + 3 * S, true), None);
        assert!(!f.check(t0 + 3 * S).0);
        // A later loss, after the flag cleared, fences again.
        f.tick(t0 + 4 * S, false);
        assert_eq!(
            f.tick(t0 + 5 * S, true),
            Some(Change::Fenced(Why::AssignmentLost))
        );
    }

    /// A fenced consumer tries a confirming commit at most every
    /// CONFIRM_EVERY, and none while its assignment is lost.
    #[test]
    fn confirming_commits_are_spaced_and_none_while_lost() {
        let t0 = Instant::now();
        let mut f = watched();
        assert!(!f.confirm_due(t0), "not fenced: nothing to confirm");
        f.tick(t0, false);
        f.tick(t0 + 50 * S, false);
        let at = t0 + 50 * S;
        assert!(f.confirm_due(at));
        assert!(!f.confirm_due(at + CONFIRM_EVERY / 2));
        assert!(f.confirm_due(at + CONFIRM_EVERY));
        f.lost(at + 2 * S);
        assert!(!f.confirm_due(at + 10 * S), "lost: only a new assignment");
    }
}
