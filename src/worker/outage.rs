//! A downstream outage, told apart from a job's own failure.
//!
//! One call that fails (5xx, timeout, refused connection) may be the job's
//! fault; many in a row, from different jobs, with no answer in between,
//! are the downstream's. Then the breaker opens: no job spends an attempt,
//! no call goes out but one probe at a time (at a growing interval capped
//! at `downstream.max_outage_probe_interval`), and the jobs wait (in memory, then
//! by pausing consumption). The first answer of any kind (2xx, 4xx, 429)
//! closes it and every waiting seller goes on at once. A 5xx that names a
//! Retry-After holds the whole downstream that long.
//!
//! Sound because it only ever delays: it never lets a call through that
//! the limiter did not grant, and a job it holds back keeps its attempts.
//! A job whose failures came while the downstream answered nothing else is
//! not dead-lettered either ([`Outage::last_answer`], judged in
//! `super::answers`): alone, it cannot be told from a dead downstream, and
//! waiting is what loses nothing.
//!
//! It returns what happened (the breaker opened or closed, who to wake);
//! the engine emits the events.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::DownstreamSettings;

use super::timers::after;

/// The first probe interval; it doubles up to `max_outage_probe_interval`.
const PROBE_BASE: Duration = Duration::from_millis(250);

#[derive(Debug)]
enum State {
    /// Calls go out. `failures` in a row (no answer between them), from
    /// the jobs in `jobs`.
    Closed {
        failures: u32,
        jobs: BTreeSet<String>,
    },
    /// Only a probe goes out, not before `next_probe`.
    Open {
        since: Instant,
        next_probe: Instant,
        probes: u32,
        /// The seller whose call is the probe under way.
        prober: Option<Arc<str>>,
        /// When the downstream last said it is down for a while (a 5xx
        /// with Retry-After): an answer to a call started before that
        /// says nothing of the hold.
        told: Option<Instant>,
    },
}

#[derive(Debug)]
pub(super) struct Outage {
    /// Failures in a row, from at least two jobs, that open the breaker.
    after: u32,
    probe_max: Duration,
    state: State,
    /// When the downstream last answered (anything but a failure).
    last_answer: Option<Instant>,
    /// Sellers held by the outage, woken when it ends.
    pub(super) waiting: BTreeSet<Arc<str>>,
}

/// What recording an answer did to the breaker.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Recorded {
    /// It opened or closed.
    pub(super) turned: Option<Turned>,
    /// The sellers to wake: it closed.
    pub(super) woken: Vec<Arc<str>>,
}

/// The breaker opened or closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turned {
    Opened,
    /// After `lasted`, and `probes` failed probes.
    Closed {
        lasted: Duration,
        probes: u32,
    },
}

/// What a call's answer says of the downstream.
pub(super) enum Health<'a> {
    /// It answered (2xx, 4xx, 429) a call that left at `started_at`: it is
    /// up, unless the call left before the downstream said it is down for
    /// a while (see [`Outage::record`]).
    Answered { started_at: Instant },
    /// It failed for this job (5xx without Retry-After, timeout, refused).
    Failed { job_id: &'a str },
    /// It said it is down for this long (5xx with Retry-After).
    Down { retry_after: Duration },
}

impl Outage {
    pub(super) fn new(d: &DownstreamSettings) -> Outage {
        Outage {
            after: d.outage_after_failures.max(1),
            probe_max: d.max_outage_probe_interval.max(PROBE_BASE),
            state: State::Closed {
                failures: 0,
                jobs: BTreeSet::new(),
            },
            last_answer: None,
            waiting: BTreeSet::new(),
        }
    }

    pub(super) fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// When the downstream last answered (anything but a failure).
    pub(super) fn last_answer(&self) -> Option<Instant> {
        self.last_answer
    }

    /// May `seller` ask for a call now? Closed: yes. Open: only as the next
    /// probe, one job at a time (`Some(1)`), else `None`: wait until the
    /// returned instant (the seller is put on the waiting list).
    pub(super) fn admit(
        &mut self,
        seller: &Arc<str>,
        now: Instant,
    ) -> Result<Option<usize>, Instant> {
        match &mut self.state {
            State::Closed { .. } => Ok(None),
            State::Open {
                next_probe, prober, ..
            } => {
                if prober.is_none() && now >= *next_probe {
                    *prober = Some(seller.clone());
                    return Ok(Some(1));
                }
                if prober.as_ref() == Some(seller) {
                    return Ok(Some(1));
                }
                self.waiting.insert(seller.clone());
                // Not before the next probe, and (while a probe is under
                // way) not at once: a timer in the past would spin.
                Err((*next_probe).max(after(now, PROBE_BASE)))
            }
        }
    }

    /// Whether an answer to a call started at `started_at` came from before
    /// the downstream said it is down for a while (a 5xx with
    /// Retry-After): a call it took before its maintenance began tells
    /// nothing of the maintenance, and must not end the hold.
    fn predates_hold(&self, started_at: Instant) -> bool {
        matches!(&self.state, State::Open { told: Some(t), .. } if started_at < *t)
    }

    /// Whether a seller with `runs` under way waits for them to end before
    /// it asks: during an outage a second call at once could be a second
    /// probe.
    pub(super) fn waits_for_run(&self, runs: usize) -> bool {
        self.is_open() && runs > 0
    }

    /// `seller`'s probe ended without a call (refused by the limiter, its
    /// job gone): the next seller may probe.
    pub(super) fn probe_dropped(&mut self, seller: &Arc<str>) {
        if let State::Open { prober, .. } = &mut self.state {
            if prober.as_ref() == Some(seller) {
                *prober = None;
            }
        }
    }

    /// Records an answer: whether the breaker opened or closed, and the
    /// sellers to wake when it closed. An answer to a call that left before
    /// a 503's Retry-After says nothing of the maintenance and records
    /// nothing (simulation seed 1082).
    pub(super) fn record(&mut self, health: Health<'_>, now: Instant) -> Recorded {
        match health {
            Health::Answered { started_at } if self.predates_hold(started_at) => {
                Recorded::default()
            }
            Health::Answered { .. } => {
                self.last_answer = Some(now);
                let turned = match &self.state {
                    State::Open { since, probes, .. } => Some(Turned::Closed {
                        lasted: now.saturating_duration_since(*since),
                        probes: *probes,
                    }),
                    State::Closed { .. } => None,
                };
                self.state = State::Closed {
                    failures: 0,
                    jobs: BTreeSet::new(),
                };
                Recorded {
                    turned,
                    woken: std::mem::take(&mut self.waiting).into_iter().collect(),
                }
            }
            Health::Failed { job_id } => {
                match &mut self.state {
                    State::Closed { failures, jobs } => {
                        *failures += 1;
                        if jobs.len() < 2 {
                            jobs.insert(job_id.to_owned());
                        }
                        if *failures >= self.after && jobs.len() >= 2 {
                            return self.open(now, PROBE_BASE);
                        }
                    }
                    State::Open {
                        next_probe,
                        probes,
                        prober,
                        ..
                    } => {
                        // The probe failed: wait longer before the next.
                        *probes += 1;
                        let wait = backoff(*probes, self.probe_max);
                        *next_probe = (*next_probe).max(after(now, wait));
                        *prober = None;
                    }
                }
                Recorded::default()
            }
            Health::Down { retry_after } => match &mut self.state {
                State::Open {
                    next_probe,
                    prober,
                    told,
                    ..
                } => {
                    *next_probe = (*next_probe).max(after(now, retry_after));
                    *prober = None;
                    *told = Some(now);
                    Recorded::default()
                }
                State::Closed { .. } => {
                    let opened = self.open(now, retry_after);
                    if let State::Open { told, .. } = &mut self.state {
                        *told = Some(now);
                    }
                    opened
                }
            },
        }
    }

    fn open(&mut self, now: Instant, first_probe: Duration) -> Recorded {
        self.state = State::Open {
            since: now,
            next_probe: after(now, first_probe),
            probes: 0,
            prober: None,
            told: None,
        };
        Recorded {
            turned: Some(Turned::Opened),
            woken: Vec::new(),
        }
    }
}

/// `PROBE_BASE * 2^(n-1)`, at most `max`.
fn backoff(n: u32, max: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(n.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    PROBE_BASE.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage() -> Outage {
        let mut s = crate::config::load_from(None, Vec::new())
            .expect("defaults")
            .settings;
        s.downstream.outage_after_failures = 3;
        s.downstream.max_outage_probe_interval = Duration::from_secs(2);
        Outage::new(&s.downstream)
    }

    /// Issue 53 (simulation seed 1082): a call accepted before a 503 with
    /// Retry-After answers 2xx after it; that does not end the hold. An
    /// answer to a call started after the 503 (the probe) does.
    #[test]
    fn a_success_of_a_call_from_before_a_retry_after_says_nothing_of_it() {
        let mut o = outage();
        let before = Instant::now();
        let told = before + Duration::from_millis(60);
        o.record(
            Health::Down {
                retry_after: Duration::from_secs(26),
            },
            told,
        );
        assert!(o.is_open());
        assert!(o.predates_hold(before), "left before the 503 was read");
        let probe = told + Duration::from_secs(26);
        assert!(!o.predates_hold(probe), "the probe left after it");
        // Failures open the breaker without a Retry-After: any answer
        // closes it, as before.
        let mut o = outage();
        for job_id in ["j1", "j2", "j1"] {
            o.record(Health::Failed { job_id }, told);
        }
        assert!(o.is_open() && !o.predates_hold(before));
    }

    #[test]
    fn failures_of_one_job_alone_do_not_open_it() {
        let mut o = outage();
        let now = Instant::now();
        for _ in 0..10 {
            o.record(Health::Failed { job_id: "j" }, now);
        }
        assert!(!o.is_open(), "one job failing is not an outage");
    }

    #[test]
    fn failures_in_a_row_from_two_jobs_open_it_and_an_answer_closes_it() {
        let mut o = outage();
        let now = Instant::now();
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        o.record(Health::Failed { job_id: "j1" }, now);
        o.record(Health::Answered { started_at: now }, now);
        o.record(Health::Failed { job_id: "j1" }, now);
        o.record(Health::Failed { job_id: "j2" }, now);
        assert!(!o.is_open(), "an answer between failures resets the count");
        let opened = o.record(Health::Failed { job_id: "j2" }, now);
        assert!(o.is_open());
        assert_eq!(opened.turned, Some(Turned::Opened), "{opened:?}");
        // Before the first probe is due nobody calls; then one seller does.
        assert_eq!(o.admit(&a, now), Err(now + PROBE_BASE));
        let due = now + PROBE_BASE;
        assert_eq!(o.admit(&a, due), Ok(Some(1)));
        assert!(o.admit(&b, due).is_err(), "one probe at a time");
        // The probe fails: the next one waits longer, capped.
        o.record(Health::Failed { job_id: "j1" }, due);
        let later = o.admit(&b, due).expect_err("waits");
        assert!(later > due);
        let closed = o.record(Health::Answered { started_at: later }, later);
        assert!(!o.is_open());
        assert!(
            closed.woken.contains(&b),
            "the waiting sellers go on: {closed:?}"
        );
        let lasted = later - now;
        assert_eq!(
            closed.turned,
            Some(Turned::Closed { lasted, probes: 1 }),
            "it says how long it lasted and how many probes failed"
        );
        assert_eq!(o.last_answer(), Some(later));
        let again = o.record(Health::Answered { started_at: later }, later);
        assert_eq!(again, Recorded::default(), "closed already: nothing turned");
        assert_eq!(o.admit(&b, later), Ok(None));
    }

    #[test]
    fn during_an_outage_a_seller_waits_for_its_run_to_end() {
        let mut o = outage();
        // (row, open, runs under way, waits)
        let rows = [
            (1, false, 0, false),
            (2, false, 3, false),
            (3, true, 0, false),
            (4, true, 1, true),
        ];
        for (row, open, runs, waits) in rows {
            if open && !o.is_open() {
                let down = Health::Down {
                    retry_after: Duration::from_secs(1),
                };
                o.record(down, Instant::now());
            }
            assert_eq!(o.is_open(), open, "row {row}");
            assert_eq!(o.waits_for_run(runs), waits, "row {row}");
        }
    }

    #[test]
    fn probe_intervals_grow_to_the_cap() {
        assert_eq!(backoff(1, Duration::from_secs(2)), PROBE_BASE);
        assert_eq!(backoff(3, Duration::from_secs(2)), PROBE_BASE * 4);
        assert_eq!(backoff(40, Duration::from_secs(2)), Duration::from_secs(2));
    }

    #[test]
    fn a_retry_after_on_a_5xx_holds_the_whole_downstream() {
        let mut o = outage();
        let now = Instant::now();
        let down = Health::Down {
            retry_after: Duration::from_secs(30),
        };
        assert_eq!(o.record(down, now).turned, Some(Turned::Opened));
        assert!(o.is_open());
        let down = Health::Down {
            retry_after: Duration::from_secs(30),
        };
        assert_eq!(o.record(down, now).turned, None, "open already");
        let a: Arc<str> = Arc::from("a");
        assert_eq!(o.admit(&a, now), Err(now + Duration::from_secs(30)));
    }
}
