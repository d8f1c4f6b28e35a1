//! What a downstream answer does: to its job (done, dead-lettered, held
//! for an outage, backed off for another attempt), to the outage's view of
//! the downstream, and, for a run's 429s, to its seller (held until when).
//!
//! Pure: each function takes the answer, the job's attempts, the outage as
//! the engine last saw it, the settings and `now` (and the jitter's random
//! source), and returns what to do. The engine (`engine/call.rs`) carries
//! it out and emits the events. A new response policy goes here.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::backoff::backoff_with;
use crate::config::DownstreamSettings;
use crate::dead_letter::DeadLetterKind;
use crate::downstream::{Answer, RetryAfter};

use super::outage::Health;
use super::timers::after;

/// The settings an answer is judged by (`[downstream]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Policy {
    /// `downstream.max_attempts`: calls a job may spend before it is
    /// dead-lettered.
    pub(super) max_attempts: u32,
    /// `downstream.backoff_base` and `downstream.max_backoff`: the first
    /// and the longest backoff.
    pub(super) backoff_base: Duration,
    pub(super) max_backoff: Duration,
}

impl Policy {
    pub(super) fn of(d: &DownstreamSettings) -> Policy {
        Policy {
            max_attempts: d.max_attempts,
            backoff_base: d.backoff_base,
            max_backoff: d.max_backoff,
        }
    }
}

/// A job's calls as its answer finds them; what the answer makes of them
/// is written back to the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tries {
    /// Calls spent, the answered one counted already (so at least one).
    pub(super) attempts: u32,
    /// Failed calls in a row, spent or not: the backoff grows with them.
    pub(super) failures_in_a_row: u32,
    /// When its previous failed call came back (none since an answer or an
    /// outage hold).
    pub(super) last_failed_at: Option<Instant>,
}

/// The downstream as the engine saw it when the answer came, the answer
/// recorded already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// The outage breaker is open.
    pub(super) outage: bool,
    /// When the downstream last answered anything but a failure.
    pub(super) last_answer: Option<Instant>,
    /// The call was one of the calls too many for the downstream's
    /// capacity ([`shed`]).
    pub(super) shed: bool,
}

/// What to do with a job after its call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// Finished: its record is done.
    Done,
    /// To the dead-letter topic, with its kind and reason.
    DeadLetter { kind: &'static str, reason: String },
    /// The downstream is out of service: the job waits, with its attempt
    /// given back, and its seller asks again at once, which during the
    /// outage means waiting on the breaker for its turn to probe.
    HoldForOutage,
    /// Backed off: called again at `at` (after `wait`, the jittered
    /// backoff of `step`).
    RetryAt {
        at: Instant,
        wait: Duration,
        step: u32,
        /// The failure, for the log.
        reason: String,
    },
}

/// What an answer makes of its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Decision {
    pub(super) action: Action,
    /// The job's calls after the answer (an attempt given back, a failure
    /// counted).
    pub(super) tries: Tries,
}

/// What an answer says of the downstream as a whole, whoever owns the job
/// now.
pub(super) fn health<'a>(answer: &Answer, job_id: &'a str, started_at: Instant) -> Health<'a> {
    match answer {
        Answer::Unreachable { .. } => Health::Failed { job_id },
        Answer::Unavailable { retry_after, .. } => Health::Down {
            retry_after: *retry_after,
        },
        Answer::Done | Answer::Retryable { .. } | Answer::Fatal { .. } | Answer::Throttled(_) => {
            Health::Answered { started_at }
        }
    }
}

/// Whether an answer is the downstream failing under load (what lowers
/// the adaptive concurrency limit): it served nothing, or said it is
/// unavailable.
pub(super) fn overload(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Unreachable { .. } | Answer::Unavailable { .. }
    )
}

/// Whether a call was shed for the downstream's load: it failed as an
/// overload and started with more calls out (`in_flight`, its own
/// counted) than the limit now allows (`limit`): one of the calls too
/// many. Such a call spends no attempt: no job is dead-lettered for the
/// downstream's capacity. A call that fails so with no more out than the
/// limit is the job's failure, and spends one.
pub(super) fn shed(overload: bool, in_flight: usize, limit: usize) -> bool {
    overload && in_flight > limit
}

/// What a call's answer (not a 429: a run ends at one, and
/// [`hold_for_429s`] judges it) makes of its job.
pub(super) fn decide(
    answer: Answer,
    tries: Tries,
    seen: Seen,
    policy: &Policy,
    now: Instant,
    rng: &mut impl Rng,
) -> Decision {
    let reached_nothing = matches!(answer, Answer::Unreachable { .. });
    let action = match answer {
        Answer::Done => Action::Done,
        Answer::Fatal { status, reason } => {
            let reason = match status {
                Some(s) => format!("downstream refused the job with HTTP {s}: {reason}"),
                None => format!("downstream refused the job: {reason}"),
            };
            let kind = DeadLetterKind::DownstreamRejected.name();
            Action::DeadLetter { kind, reason }
        }
        Answer::Unavailable { .. } => return held_for_outage(tries),
        Answer::Unreachable { .. } if seen.outage => return held_for_outage(tries),
        Answer::Retryable { reason } | Answer::Unreachable { reason } => {
            return failed(tries, reached_nothing, seen, policy, now, rng, reason)
        }
        Answer::Throttled(_) => {
            unreachable!("a run ends at a 429 and returns the job as unused")
        }
    };
    Decision { action, tries }
}

/// A call that failed in a way another attempt may fix: backed off, or
/// dead-lettered once `downstream.max_attempts` are spent.
fn failed(
    mut tries: Tries,
    reached_nothing: bool,
    seen: Seen,
    policy: &Policy,
    now: Instant,
    rng: &mut impl Rng,
    reason: String,
) -> Decision {
    // A call that reached nothing, when the downstream answered nothing
    // else since this job's previous failure, cannot be told from a dead
    // downstream: it spends no attempt (the job waits with its backoff).
    // Judged against the previous failure, not the first: answers between
    // two outages (a 429, say) do not make the attempts of the first one
    // count.
    let previous = tries.last_failed_at.replace(now);
    let answered_since = |at: Instant| seen.last_answer.is_some_and(|last| last > at);
    let unreached = reached_nothing && previous.is_some_and(|at| !answered_since(at));
    // One of the calls too many for the downstream's capacity: the
    // downstream's load, not the job.
    if unreached || seen.shed {
        give_back_attempt(&mut tries);
    }
    let max = policy.max_attempts;
    if tries.attempts >= max {
        let reason = format!(
            "downstream failed {} times (downstream.max_attempts = {max}); last: {reason}",
            tries.attempts
        );
        let kind = DeadLetterKind::AttemptsExhausted.name();
        let action = Action::DeadLetter { kind, reason };
        return Decision { action, tries };
    }
    tries.failures_in_a_row += 1;
    let step = tries.failures_in_a_row.max(tries.attempts);
    let wait = backoff_with(step, policy.backoff_base, policy.max_backoff, rng);
    let action = Action::RetryAt {
        at: after(now, wait),
        wait,
        step,
        reason,
    };
    Decision { action, tries }
}

/// A job whose call failed while the downstream is out of service: it
/// keeps its attempt, and its failures in a row start again.
fn held_for_outage(mut tries: Tries) -> Decision {
    give_back_attempt(&mut tries);
    tries.last_failed_at = None;
    tries.failures_in_a_row = 0;
    Decision {
        action: Action::HoldForOutage,
        tries,
    }
}

/// Gives back the attempt the engine counted for this answer (it counts
/// one before routing any answer, so a job here has at least one): not
/// clamped, since a job with none to give back would be a job whose answer
/// was routed twice.
fn give_back_attempt(tries: &mut Tries) {
    debug_assert!(tries.attempts > 0, "gave back an attempt never spent");
    tries.attempts -= 1;
}

/// A 429 a run met: what it asked for, and the attempts of the job it
/// answered (the worker's own backoff grows with them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Met429 {
    pub(super) retry_after: RetryAfter,
    pub(super) attempts: u32,
}

/// How a run's 429s hold their seller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hold429 {
    /// The hold: the longest any of them asks for.
    pub(super) wait: Duration,
    pub(super) until: Instant,
}

/// The hold a run's 429s ask for (none without one): the longest. A 429
/// that names no useful wait (none, garbage, zero, a date in the past)
/// gets the worker's own backoff, growing with the seller's 429s in a row
/// (`in_a_row`, these counted) and jittered so that replicas do not come
/// back in lockstep: without it "Retry-After: 0" is a tight loop (a 429
/// never spends an attempt).
pub(super) fn hold_for_429s(
    met: &[Met429],
    in_a_row: u32,
    policy: &Policy,
    now: Instant,
    rng: &mut impl Rng,
) -> Option<Hold429> {
    let (base, max) = (policy.backoff_base, policy.max_backoff);
    let wait = met
        .iter()
        .map(|t| match t.retry_after {
            RetryAfter::Wait(wait) if !wait.is_zero() => wait,
            _ => backoff_with(in_a_row.max(t.attempts + 1), base, max, rng),
        })
        .max()?;
    Some(Hold429 {
        wait,
        until: after(now, wait),
    })
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn policy() -> Policy {
        Policy {
            max_attempts: 3,
            backoff_base: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }

    fn answer(kind: &str) -> Answer {
        let reason = format!("{kind} reason");
        match kind {
            "done" => Answer::Done,
            "fatal" => Answer::Fatal {
                status: Some(400),
                reason,
            },
            "fatal-unsent" => Answer::Fatal {
                status: None,
                reason,
            },
            "retryable" => Answer::Retryable { reason },
            "unreachable" => Answer::Unreachable { reason },
            "unavailable" => Answer::Unavailable {
                retry_after: 30 * S,
                reason,
            },
            other => panic!("no answer kind {other}"),
        }
    }

    /// What a row expects, without the jitter (checked apart).
    #[derive(Debug, PartialEq, Eq)]
    enum Want {
        Done,
        DeadLetter(&'static str),
        Hold,
        Retry { step: u32 },
    }

    fn want(action: &Action) -> Want {
        match action {
            Action::Done => Want::Done,
            Action::DeadLetter { kind, .. } => Want::DeadLetter(kind),
            Action::HoldForOutage => Want::Hold,
            Action::RetryAt { step, .. } => Want::Retry { step: *step },
        }
    }

    /// One row per answer kind × attempts × outage state: the answer, the
    /// attempts with it counted, the failures in a row before it, whether
    /// an earlier failure is on record (and answered since), whether the
    /// breaker is open, whether the call was shed; then what the job
    /// becomes and its attempts and failures in a row after.
    #[test]
    fn each_answer_to_its_action() {
        use Want::*;
        const REJECTED: &str = "downstream_rejected";
        const EXHAUSTED: &str = "attempts_exhausted";
        // (row, answer, attempts, in a row, previous failure (answered
        //  since), open, shed) -> (want, attempts, in a row)
        type Row = (
            u32,
            &'static str,
            u32,
            u32,
            Option<bool>,
            bool,
            bool,
            Want,
            u32,
            u32,
        );
        #[rustfmt::skip]
        let rows: &[Row] = &[
            (1, "done", 1, 0, None, false, false, Done, 1, 0),
            (2, "done", 3, 2, Some(true), true, false, Done, 3, 2),
            (3, "fatal", 1, 0, None, false, false, DeadLetter(REJECTED), 1, 0),
            (4, "fatal-unsent", 2, 1, None, true, false, DeadLetter(REJECTED), 2, 1),
            // Retryable: spends its attempt, backs off by the larger of
            // attempts and failures in a row, dead-letters at the max.
            (5, "retryable", 1, 0, None, false, false, Retry { step: 1 }, 1, 1),
            (6, "retryable", 2, 4, Some(false), false, false, Retry { step: 5 }, 2, 5),
            (7, "retryable", 3, 2, Some(true), false, false, DeadLetter(EXHAUSTED), 3, 2),
            // Even with the breaker open: a 500 is an answer about the job.
            (8, "retryable", 3, 2, None, true, false, DeadLetter(EXHAUSTED), 3, 2),
            // Shed for the downstream's load: the attempt goes back.
            (9, "retryable", 3, 2, None, false, true, Retry { step: 3 }, 2, 3),
            // Unreachable, breaker closed: the first failure spends one.
            (10, "unreachable", 1, 0, None, false, false, Retry { step: 1 }, 1, 1),
            (11, "unreachable", 3, 0, None, false, false, DeadLetter(EXHAUSTED), 3, 0),
            // Answered since its previous failure: spends one.
            (12, "unreachable", 3, 2, Some(true), false, false, DeadLetter(EXHAUSTED), 3, 2),
            // Nothing answered since: cannot be told from a dead
            // downstream, spends none.
            (13, "unreachable", 3, 2, Some(false), false, false, Retry { step: 3 }, 2, 3),
            (14, "unreachable", 2, 1, None, false, true, Retry { step: 2 }, 1, 2),
            // Breaker open: held, attempt back, failures forgotten.
            (15, "unreachable", 1, 0, None, true, false, Hold, 0, 0),
            (16, "unreachable", 3, 5, Some(true), true, false, Hold, 2, 0),
            // 5xx with Retry-After: held whatever the breaker says.
            (17, "unavailable", 1, 0, None, false, false, Hold, 0, 0),
            (18, "unavailable", 3, 4, Some(false), true, true, Hold, 2, 0),
        ];
        let now = Instant::now() + 100 * S;
        let earlier = now - 10 * S;
        for (
            row,
            kind,
            attempts,
            in_a_row,
            previous,
            open,
            shed,
            want_action,
            want_attempts,
            want_in_a_row,
        ) in rows
        {
            let tries = Tries {
                attempts: *attempts,
                failures_in_a_row: *in_a_row,
                last_failed_at: previous.map(|_| earlier),
            };
            let seen = Seen {
                outage: *open,
                last_answer: match previous {
                    Some(true) => Some(earlier + S),
                    Some(false) => Some(earlier - S),
                    None => None,
                },
                shed: *shed,
            };
            let mut rng = StdRng::seed_from_u64(7);
            let d = decide(answer(kind), tries, seen, &policy(), now, &mut rng);
            let ctx = format!("row {row}: {kind} with {tries:?}, {seen:?} -> {d:?}");
            assert_eq!(want(&d.action), *want_action, "{ctx}");
            assert_eq!(d.tries.attempts, *want_attempts, "attempts, {ctx}");
            assert_eq!(d.tries.failures_in_a_row, *want_in_a_row, "in a row, {ctx}");
            let want_last = match (kind, &d.action) {
                (_, Action::HoldForOutage) => None,
                (&"retryable" | &"unreachable", _) => Some(now),
                _ => tries.last_failed_at,
            };
            assert_eq!(d.tries.last_failed_at, want_last, "last failure, {ctx}");
            if let Action::RetryAt {
                at,
                wait,
                step,
                reason,
            } = &d.action
            {
                let mut rng = StdRng::seed_from_u64(7);
                let p = policy();
                let jittered = backoff_with(*step, p.backoff_base, p.max_backoff, &mut rng);
                assert_eq!(*wait, jittered, "the backoff of its step, {ctx}");
                assert_eq!(*at, now + *wait, "{ctx}");
                assert_eq!(reason, &format!("{kind} reason"), "{ctx}");
            }
        }
    }

    #[test]
    fn dead_letter_reasons_name_the_status_and_the_limit() {
        let tries = Tries {
            attempts: 3,
            failures_in_a_row: 2,
            last_failed_at: None,
        };
        let seen = Seen {
            outage: false,
            last_answer: None,
            shed: false,
        };
        let now = Instant::now();
        let rng = &mut StdRng::seed_from_u64(1);
        let mut reason = |a: Answer| match decide(a, tries, seen, &policy(), now, rng).action {
            Action::DeadLetter { reason, .. } => reason,
            other => panic!("not a dead letter: {other:?}"),
        };
        assert_eq!(
            reason(answer("fatal")),
            "downstream refused the job with HTTP 400: fatal reason"
        );
        assert_eq!(
            reason(answer("fatal-unsent")),
            "downstream refused the job: fatal-unsent reason"
        );
        assert_eq!(
            reason(answer("retryable")),
            "downstream failed 3 times (downstream.max_attempts = 3); last: retryable reason"
        );
    }

    #[test]
    fn each_answer_to_its_health_and_load() {
        // (row, answer, health, overload)
        let rows = [
            (1, "done", "answered", false),
            (2, "fatal", "answered", false),
            (3, "retryable", "answered", false),
            (4, "unreachable", "failed", true),
            (5, "unavailable", "down 30s", true),
        ];
        for (row, kind, want_health, want_overload) in rows {
            let a = answer(kind);
            let got = match health(&a, "j", Instant::now()) {
                Health::Answered { .. } => "answered".to_owned(),
                Health::Failed { job_id } => {
                    assert_eq!(job_id, "j", "row {row}");
                    "failed".to_owned()
                }
                Health::Down { retry_after } => format!("down {}s", retry_after.as_secs()),
            };
            assert_eq!(got, want_health, "row {row}: {kind}");
            assert_eq!(overload(&a), want_overload, "row {row}: {kind}");
        }
        let throttled = Answer::Throttled(RetryAfter::Unspecified);
        let left = Instant::now();
        assert!(matches!(
            health(&throttled, "j", left),
            Health::Answered { started_at } if started_at == left
        ));
        assert!(!overload(&throttled), "a 429 is not the downstream failing");
    }

    #[test]
    fn only_an_overload_beyond_the_limit_is_shed() {
        // (row, overload, in flight, limit, shed)
        let rows = [
            (1, true, 5, 4, true),
            (2, true, 4, 4, false),
            (3, true, 1, 4, false),
            (4, false, 9, 4, false),
        ];
        for (row, over, in_flight, limit, want) in rows {
            assert_eq!(shed(over, in_flight, limit), want, "row {row}");
        }
    }

    /// Regression: "Retry-After: 0" held the seller for nothing, a tight
    /// loop of 429s; a missing or zero wait gets the worker's backoff.
    #[test]
    fn a_runs_429s_hold_for_the_longest_wait_and_a_zero_gets_a_backoff() {
        let p = policy();
        let now = Instant::now();
        let met = |retry_after, attempts| Met429 {
            retry_after,
            attempts,
        };
        let backoff = |step| {
            backoff_with(
                step,
                p.backoff_base,
                p.max_backoff,
                &mut StdRng::seed_from_u64(3),
            )
        };
        // (row, 429s met, in a row, hold)
        let rows: Vec<(u32, Vec<Met429>, u32, Option<Duration>)> = vec![
            (1, vec![], 1, None),
            (2, vec![met(RetryAfter::Wait(2 * S), 0)], 1, Some(2 * S)),
            (
                3,
                vec![
                    met(RetryAfter::Wait(2 * S), 0),
                    met(RetryAfter::Wait(5 * S), 0),
                ],
                1,
                Some(5 * S),
            ),
            // Zero and unspecified: the backoff of the larger of the 429s
            // in a row and the job's next attempt.
            (
                4,
                vec![met(RetryAfter::Wait(Duration::ZERO), 0)],
                1,
                Some(backoff(1)),
            ),
            (
                5,
                vec![met(RetryAfter::Unspecified, 0)],
                6,
                Some(backoff(6)),
            ),
            (
                6,
                vec![met(RetryAfter::Unspecified, 7)],
                2,
                Some(backoff(8)),
            ),
            // A named wait longer than the backoff wins.
            (
                7,
                vec![
                    met(RetryAfter::Unspecified, 0),
                    met(RetryAfter::Wait(60 * S), 0),
                ],
                1,
                Some(60 * S),
            ),
        ];
        for (row, met, in_a_row, want) in rows {
            let got = hold_for_429s(&met, in_a_row, &p, now, &mut StdRng::seed_from_u64(3));
            assert_eq!(got.map(|h| h.wait), want, "row {row}: {met:?}");
            if let Some(h) = got {
                assert_eq!(h.until, now + h.wait, "row {row}");
            }
        }
    }
}
