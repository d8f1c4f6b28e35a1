//! What the limiter answers: three outcomes, each its own type, for one
//! cost ([`Decision`]) or for a list of job costs ([`BatchDecision`]).
//!
//! A refusal carries the time after which the same request can succeed
//! (never earlier: every script rounds up), and a request that can never pass
//! is a different outcome from one that must wait, so a caller cannot retry
//! the impossible forever.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::rule::Rule;

/// How many units a call may be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Grant the whole cost or nothing.
    AllOrNothing,
    /// Grant as many as can pass now, from 1 up to the cost. Used to release
    /// a waiting backlog with one call.
    UpTo,
}

/// The limiter's answer for one seller and one cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Granted(Granted),
    Denied(Denied),
    /// The cost is above what some rule can ever hold: waiting will not help.
    Never(CannotPass),
}

impl Decision {
    /// Units granted (0 unless [`Decision::Granted`]).
    pub fn granted(&self) -> u64 {
        match self {
            Decision::Granted(g) => g.granted,
            _ => 0,
        }
    }
}

/// Permission for `granted` units (at least 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub granted: u64,
    /// Units still admissible now under the tightest rule, after this grant.
    pub remaining: u64,
    /// Time until every rule is back to its full, unused state.
    pub reset_after: Duration,
    /// Set when a pacer (leaky_bucket) rule took part: the instant each
    /// granted unit may go.
    pub pace: Option<Pace>,
    /// When the script decided, on the store's clock (µs since the epoch).
    pub decided_at_us: u64,
}

/// When paced units may leave: the first at `first_at_us`, each next one
/// `interval_us` later (rounded up, so never early).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Unix time in microseconds, on the store's clock.
    pub first_at_us: u64,
    /// The same instant as a wait from the decision, for callers whose own
    /// clock differs from Redis': wait this long after receiving the grant.
    pub first_after: Duration,
    pub interval_us: u64,
}

impl Pace {
    /// The instant unit `i` (0-based) of the grant may go, on the store's clock.
    pub fn unit_at(&self, i: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.first_at_us + i * self.interval_us)
    }

    /// How long after the decision unit `i` may go.
    pub fn unit_after(&self, i: u64) -> Duration {
        self.first_after + Duration::from_micros(i * self.interval_us)
    }
}

/// Refusal: nothing was charged; try again after `retry_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// Exact wait, rounded up to the microsecond; never early.
    pub retry_after: Duration,
    pub remaining: u64,
    pub reset_after: Duration,
    pub by: DeniedBy,
    /// When the script decided, on the store's clock (µs since the epoch).
    pub decided_at_us: u64,
}

impl Denied {
    /// The retry-after as the scripts report it to operators: whole
    /// milliseconds, rounded up.
    pub fn retry_after_ms(&self) -> u64 {
        (self.retry_after.as_micros() as u64).div_ceil(1000)
    }
}

/// What refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeniedBy {
    /// The rule at this index of the seller's rule set (global rules follow
    /// the seller's rules).
    Rule(usize),
    /// The downstream answered 429 for this seller; the block is shared.
    DownstreamBlock,
    /// The limiter could not be asked (Redis unavailable) and the failure
    /// policy refused in its place.
    Unavailable,
    /// Every slot of the seller's `max_in_flight` is taken: the seller is
    /// capacity-bound, not limit-bound, and asks again after the poll.
    MaxInFlight,
}

/// A cost above the capacity of rule `rule`: it can never be granted whole.
///
/// Displays as the reason a dead-lettered job carries:
///
/// ```
/// use std::time::Duration;
/// use throttle_worker::limiter::{Algorithm, CannotPass, Rule};
///
/// let rule = Rule::new(Algorithm::SlidingWindowLog, 100, Duration::from_secs(60), None).unwrap();
/// let never = CannotPass { cost: 500, capacity: 100, rule: 0, limit: Some(rule) };
/// assert_eq!(
///     never.to_string(),
///     "cost 500 exceeds rule sliding_window_log 100/1m (capacity 100); split the job or give the seller a burst"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CannotPass {
    pub cost: u64,
    pub capacity: u64,
    /// Index in the seller's rule set (global rules follow the seller's).
    pub rule: usize,
    /// That rule; `None` only for a reply that names a rule the call did
    /// not send (never produced by the scripts).
    pub limit: Option<Rule>,
}

impl fmt::Display for CannotPass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cost {} exceeds rule ", self.cost)?;
        match &self.limit {
            Some(r) => {
                write!(
                    f,
                    "{} {}/{}",
                    r.algorithm(),
                    r.limit(),
                    humantime::format_duration(r.period())
                )?;
                if r.algorithm().uses_burst() && r.burst() != r.limit() {
                    write!(f, " burst {}", r.burst())?;
                }
            }
            None => write!(f, "#{}", self.rule + 1)?,
        }
        write!(
            f,
            " (capacity {}); split the job or give the seller a burst",
            self.capacity
        )
    }
}

/// The limiter's answer for a list of jobs with their costs (in queue
/// order), each granted all or nothing across every rule: the longest
/// prefix that fits. A refused job ends the prefix; lighter jobs after it
/// are not granted past it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchDecision {
    /// At least the first job may run.
    Granted(BatchGranted),
    /// The first job must wait; nothing was charged.
    Denied(Denied),
    /// The first job can never pass: its cost is above a rule's capacity.
    Never(CannotPass),
}

impl BatchDecision {
    /// Jobs granted (0 unless [`BatchDecision::Granted`]).
    pub fn jobs(&self) -> usize {
        match self {
            BatchDecision::Granted(g) => g.jobs,
            _ => 0,
        }
    }

    /// A grant-up-to answer for jobs of cost 1 each, read as a batch: `n`
    /// units granted are the first `n` jobs. Nothing is known of why the
    /// grant stopped, so `next` is empty.
    pub fn from_units(d: Decision) -> BatchDecision {
        match d {
            Decision::Granted(g) => BatchDecision::Granted(BatchGranted {
                jobs: g.granted as usize,
                units: g.granted,
                remaining: g.remaining,
                tightest: None,
                reset_after: g.reset_after,
                pace: g.pace,
                decided_at_us: g.decided_at_us,
                next: None,
                leases: Vec::new(),
                receipt: None,
            }),
            Decision::Denied(d) => BatchDecision::Denied(d),
            Decision::Never(c) => BatchDecision::Never(c),
        }
    }
}

/// Permission for the first `jobs` jobs of the list, `units` units in all;
/// exactly those units were charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchGranted {
    /// At least 1.
    pub jobs: usize,
    /// The sum of the granted jobs' costs.
    pub units: u64,
    /// Units still admissible now under the tightest rule, after this grant.
    pub remaining: u64,
    /// That tightest rule: its index in the seller's rules then the global
    /// ones (the first of equals); `None` when no rule applies or it is
    /// not known.
    pub tightest: Option<usize>,
    /// Time until every rule is back to its full, unused state.
    pub reset_after: Duration,
    /// Set when a pacer took part: unit `i` of the grant may go at
    /// `unit_at(i)`; job `j` starts at the unit after the costs of the
    /// jobs before it.
    pub pace: Option<Pace>,
    /// When the script decided, on the store's clock (µs since the epoch).
    pub decided_at_us: u64,
    /// The first job not granted, if the grant stopped short of the list.
    pub next: Option<NextJob>,
    /// The slots of the seller's `max_in_flight` the grant took, one per
    /// granted job in order (empty without a cap). Each goes back when
    /// its job's call is answered or will not be made
    /// ([`Limiter::release`](super::Limiter::release)), or lapses.
    pub leases: Vec<String>,
    /// What names the units this grant charged in the store, so that
    /// units no call used can be given back
    /// ([`Limiter::give_back`](super::Limiter::give_back)); `None` when no
    /// store charged any rule (a dry run, an unlimited seller, the
    /// failure policy's grants).
    pub receipt: Option<Receipt>,
}

/// The charge of a grant in the store: its request's call id and the
/// instant the script took the units (µs on the store's clock), which is
/// what a refund of those units names (`lua/limiter.lua`, `refund`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub call_id: String,
    pub taken_at_us: u64,
}

/// Units of a grant that no call will use, on their way back
/// ([`Limiter::give_back`](super::Limiter::give_back)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unused {
    /// Every unit given back: rules that count units come back by these.
    pub units: u64,
    /// Those of them that, with the ones given back before, end the grant
    /// (no unit after them used or still held): all a pacer may take back,
    /// since its grant's units are its slots in time, first to last, and a
    /// slot before one still used cannot be handed out again.
    pub at_tail: u64,
}

/// Why the job after a granted prefix was not granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextJob {
    /// It can pass `retry_after` after the decision (the grant included).
    Wait { retry_after: Duration, by: DeniedBy },
    /// It can never pass.
    Never(CannotPass),
}
