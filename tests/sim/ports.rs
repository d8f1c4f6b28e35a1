//! The simulated downstream, record writer and Redis, each driven by the
//! seed's fault schedule ([`Faults`]). A dead incarnation's calls never
//! complete: a killed process sends nothing more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{Stream, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use throttle_worker::downstream::{retry_after, Answer};
use throttle_worker::job::Job;
use throttle_worker::kafka::{OriginalRecord, Position, RetryHeaders, Verdict};
use throttle_worker::limiter::{
    call_life_us, BatchDecision, BlockAt, BlockCall, Blocked, Coalescer, Decision, EpochFound,
    JobsCall, JobsReply, JobsRequest, Learnt, Pause, Receipt, RefundCall, RestoreCall,
    RollbackFound, Rule, Store, Unused,
};
use throttle_worker::worker::{
    Caller, Clock, PermitError, Permits, SellerInfo, WriteError, Writer,
};

use crate::lua_redis::keyspace::Snapshot;
use crate::lua_redis::{EmbeddedError, EmbeddedRedis, KeyCopy, Mode};

use super::broker::{SharedBroker, SimRecord};
use super::clock::SimClock;
use super::journal::{Arrival, Ask, Call, Journal, Log, Release};

/// A window of virtual time, in ms since the start.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub from_ms: u64,
    pub to_ms: u64,
}

impl Window {
    pub fn contains(&self, at_ms: u64) -> bool {
        (self.from_ms..self.to_ms).contains(&at_ms)
    }
}

/// How the downstream fails during an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageKind {
    Status503,
    Timeout,
    Refused,
    /// A planned maintenance: 503 with `Retry-After: <seconds>`, which
    /// the client reads as the downstream down that long
    /// (`Answer::Unavailable`).
    Maintenance {
        retry_after_s: u64,
    },
    /// A downstream too slow for the client: each call, with this chance
    /// in percent, is registered (the job is done, as far as the
    /// downstream goes) only after the client's timeout gave up on it, so
    /// the client sees a timeout and calls the job again later. The other
    /// calls are answered in time.
    GaveUp {
        percent: u8,
    },
}

/// What a throttling downstream says in `Retry-After`.
#[derive(Debug, Clone)]
pub enum RetryAfterKind {
    Seconds(u64),
    Zero,
    PastDate,
    Garbage,
    Huge,
    Absent,
}

/// A downstream that can take only so many calls at once, and does not
/// say how many: beyond `calls` under way it sheds the call at once (503),
/// or queues it (each call as slow as the load over `calls` makes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HiddenCapacity {
    pub calls: usize,
    pub shed: bool,
}

/// The seed's faults, fixed before the run.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub outages: Vec<(Window, OutageKind)>,
    /// 429 storms: the window, the seller (None: every seller), the header.
    pub throttles: Vec<(Window, Option<String>, RetryAfterKind)>,
    pub redis_errors: Vec<Window>,
    pub redis_hangs: Vec<Window>,
    /// Chance that one write to a retry tier or the DLQ fails.
    pub write_failure: f64,
    /// Records over this many bytes are refused as too large.
    pub max_message_bytes: usize,
    /// Downstream latency bounds (ms).
    pub latency_ms: (u64, u64),
    /// Redis round-trip bounds (µs).
    pub redis_latency_us: (u64, u64),
    pub timeout: Duration,
    pub max_retry_after: Duration,
    /// Operators' pauses: the window, the seller (None: every seller), and
    /// whether the pause names its end (`--for`) or waits for a resume.
    pub pauses: Vec<(Window, Option<String>, bool)>,
    /// Virtual ms at which Redis loses its data (a restart without
    /// persistence): every key of the limiter, the epoch of its loss guard
    /// too.
    pub state_losses: Vec<u64>,
    /// Partial losses: at each virtual ms, the sellers' state keys
    /// ([`Faults::rollback_keys`]) go back to their copy of that many ms
    /// before on the same server (a `RESTORE` of older copies), the
    /// epoch staying as it was.
    pub rollbacks: Vec<(u64, u64)>,
    /// The keys a partial loss puts back: every seller's state hash.
    pub rollback_keys: Vec<String>,
    /// Failovers: at each virtual ms, another Redis server takes over
    /// with every key as it was that many ms before (a replica promoted
    /// that missed the last writes, or a restart that loaded an older
    /// save): the epoch, the marks and the calls' records went back with
    /// the state, and the server's run id is another.
    pub failovers: Vec<(u64, u64)>,
    /// How many calls at once the downstream can take (none: any number).
    pub capacity: Option<HiddenCapacity>,
    /// Sellers the downstream allows fewer calls than their rule: beyond
    /// this many calls of the seller in a virtual second (aligned windows,
    /// as many APIs count), it answers 429 with `Retry-After: 1`. A call it
    /// refuses does not count.
    pub seller_rates: Vec<(String, u64)>,
    /// A downstream that answers in bunches: each answer waits for the
    /// next multiple of this many virtual ms after its latency (a batching
    /// API; or a replica so busy that many answers wait for each turn of
    /// its loop, as a CPU-bound one does). None: each as it comes.
    pub answer_tick_ms: Option<u64>,
    /// (at, records): the broker sends every owned partition's last that
    /// many records again (a fetch retried, issue 53 item 4): each
    /// consumer's position goes back, never before where its assignment
    /// began. Ascending.
    pub redeliveries: Vec<(u64, i64)>,
    /// Produce outages (issue 53 item 4): every write to a retry tier or
    /// the dead-letter topic fails while one lasts (their brokers
    /// unreachable), for seconds to tens of seconds.
    pub produce_outages: Vec<Window>,
    /// A slow but answering Redis (issue 53 item 4): in each window, each
    /// way of a round trip (the call to the server, its reply back) takes
    /// from `.0` to `.1` ms more, drawn per call and way. A call whose
    /// way out is past `REDIS_TIMEOUT` is given up before its script runs;
    /// one whose reply comes back past it ran, and its caller timed out.
    pub redis_slow: Vec<(Window, (u64, u64))>,
    /// One replica losing Redis while the others keep it (issue 53 item
    /// 4, fleets only): in each window, every call of the member at that
    /// place among the fleet's members (modulo their number, see
    /// [`World::members`]) fails as said; the others' calls are answered.
    pub replica_redis: Vec<(Window, usize, ReplicaFault)>,
    /// (at, ms): the broker loses the group's commits of the last that
    /// many ms (issue 53, item 4: an unclean failover of the group's
    /// coordinator): every partition's committed offset goes back to the
    /// newest commit that old (`Broker::lose_commits`). Ascending.
    pub lost_commits: Vec<(u64, u64)>,
}

/// How one replica's calls fail in a [`Faults::replica_redis`] window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaFault {
    /// Refused at once (its connection cut).
    Down,
    /// Unanswered until the timeout, as in a `redis_hangs` window: half
    /// the time after the script ran.
    Hung,
}

/// Per-job behaviour of the downstream, beyond the faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poison {
    None,
    /// Always 400: dead-lettered as rejected (its own fault).
    Rejected,
    /// Always 500: dead-lettered after its attempts (its own fault).
    AlwaysFails,
}

pub struct World {
    pub clock: Arc<SimClock>,
    pub journal: Arc<Journal>,
    pub broker: SharedBroker,
    pub faults: Faults,
    pub poison: Vec<Poison>,
    /// Redis: the production Lua on an embedded server.
    pub redis: Mutex<EmbeddedRedis>,
    /// How many of `faults.state_losses` Redis has suffered so far.
    pub losses: std::sync::atomic::AtomicUsize,
    /// How many of `faults.rollbacks` Redis has suffered so far.
    pub rollbacks: std::sync::atomic::AtomicUsize,
    /// Copies of `faults.rollback_keys` (virtual ms, copies), oldest
    /// first, one every [`COPY_EVERY_MS`], for the partial losses to put
    /// back; none in a world without them.
    pub copies: Mutex<Copies<Vec<KeyCopy>>>,
    /// How many of `faults.failovers` Redis has suffered so far.
    pub failovers: std::sync::atomic::AtomicUsize,
    /// Every key, one copy per [`COPY_EVERY_MS`] (virtual ms, copy),
    /// oldest first, for the failovers to take over from; none in a world
    /// without them.
    pub snapshots: Mutex<Copies<Snapshot>>,
    /// The world's own randomness (latencies, write failures), apart from
    /// the engine's.
    pub rng: Mutex<StdRng>,
    /// Calls under way at the downstream (every replica's).
    pub downstream_busy: std::sync::atomic::AtomicUsize,
    /// Per seller of `faults.seller_rates`: its window (virtual s) and the
    /// calls it let through in it.
    pub rate_windows: Mutex<std::collections::HashMap<String, (u64, u64)>>,
    /// A fleet's members in order, by process id (`SimStore::process`):
    /// what a [`Faults::replica_redis`] window's place names. Empty in a
    /// single-process world, which such windows never touch.
    pub members: Mutex<Vec<u64>>,
}

impl World {
    pub fn now_ms(&self) -> u64 {
        self.clock.elapsed_ms()
    }

    fn random(&self, lo: u64, hi: u64) -> u64 {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random_range(lo..=hi.max(lo))
    }

    fn chance(&self, p: f64) -> bool {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.random_bool(p.clamp(0.0, 1.0))
    }

    /// Whether a call of `seller` at `at_ms` is beyond the `per_s` calls
    /// the downstream allows it in that virtual second; counts it when not.
    fn over_rate(&self, seller: &str, per_s: u64, at_ms: u64) -> bool {
        let mut windows = self.rate_windows.lock().unwrap_or_else(|p| p.into_inner());
        let (window, calls) = windows.entry(seller.to_owned()).or_insert((0, 0));
        if *window != at_ms / 1000 {
            (*window, *calls) = (at_ms / 1000, 0);
        }
        if *calls >= per_s {
            return true;
        }
        *calls += 1;
        false
    }

    /// Whether an outage of `kind` applies to the call arriving now: a
    /// downstream that gives up on only some calls draws for each.
    fn outage_applies(&self, kind: OutageKind) -> bool {
        match kind {
            OutageKind::GaveUp { percent } => self.chance(f64::from(percent) / 100.0),
            _ => true,
        }
    }

    /// How a [`Faults::replica_redis`] window fails process `process`'s
    /// Redis calls at `at_ms`, if one does.
    pub fn cut_off(&self, process: u64, at_ms: u64) -> Option<ReplicaFault> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if members.is_empty() {
            return None;
        }
        self.faults
            .replica_redis
            .iter()
            .find(|(win, place, _)| {
                win.contains(at_ms) && members[place % members.len()] == process
            })
            .map(|&(_, _, kind)| kind)
    }

    pub fn seeded(seed: u64) -> Mutex<StdRng> {
        Mutex::new(StdRng::seed_from_u64(seed ^ 0x005e_ed0f_7e57))
    }
}

/// The class of a call the downstream registered (a success, as far as it
/// goes) after the client gave up on it at its timeout.
pub const GAVE_UP: &str = "2xx-after-timeout";

/// What the client makes of a 503 that names `Retry-After: <secs>`: the
/// product's own reading (`downstream::client::classify_response`, which
/// needs a `reqwest::Response`, so its branch for a retryable status is
/// repeated here over the product's `retry_after`): a useful wait is
/// `Unavailable`, anything else a 503 without one.
fn maintenance(clock: &SimClock, secs: u64, max: Duration) -> Answer {
    let now = std::time::UNIX_EPOCH + Duration::from_micros(clock.unix_us());
    let reason = "downstream answered 503 Service Unavailable".to_owned();
    match retry_after(vec![secs.to_string().as_str()], now, max) {
        throttle_worker::downstream::RetryAfter::Wait(wait) if !wait.is_zero() => {
            Answer::Unavailable {
                retry_after: wait,
                reason,
            }
        }
        _ => Answer::Unreachable { reason },
    }
}

/// A process's stall (a GC-like pause, a SIGSTOP, a starved host): while
/// it lasts the process reaches nothing (no call, no Redis command, no
/// write, no poll), and what its code runs meanwhile it really runs when
/// the stall ends, so its clock reads that instant
/// (`SimClock::stalling`). None unless a fleet stalls it
/// (`Scenario::stalls`).
#[derive(Debug, Default)]
pub struct Stall(Mutex<Option<(tokio::time::Instant, tokio::time::Instant)>>);

impl Stall {
    /// The process stalls from `from` to `to`.
    pub fn set(&self, from: tokio::time::Instant, to: tokio::time::Instant) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((from, to));
    }

    /// The end of the stall under way at `now`, if one is.
    pub fn until(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let stall = *self.0.lock().unwrap_or_else(|p| p.into_inner());
        stall
            .filter(|(from, to)| *from <= now && now < *to)
            .map(|(_, to)| to)
    }

    /// When the last stall ended, if it has by `now`.
    pub fn ended(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let stall = *self.0.lock().unwrap_or_else(|p| p.into_inner());
        stall.map(|(_, to)| to).filter(|to| *to <= now)
    }

    /// The instant the process's code that runs at `now` really runs at.
    pub fn runs_at(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        self.until(now).unwrap_or(now)
    }

    /// Waits out the stall under way, if any.
    pub async fn wait(&self) {
        while let Some(to) = self.until(tokio::time::Instant::now()) {
            tokio::time::sleep_until(to).await;
        }
    }
}

async fn never() -> ! {
    std::future::pending::<()>().await;
    unreachable!()
}

/// The downstream API.
pub struct SimDownstream {
    pub world: Arc<World>,
    pub dead: Arc<AtomicBool>,
    /// The calling process (its incarnation's number), for the journal.
    pub process: u64,
    pub stall: Arc<Stall>,
}

impl Caller for SimDownstream {
    async fn call(&self, job: &Job, granted_at_us: Option<u64>) -> Answer {
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        // A stalled process sends nothing until it resumes.
        self.stall.wait().await;
        let w = &self.world;
        let id = w.journal.with(|l| l.by_job_id.get(&job.job_id).copied());
        let Some(id) = id else {
            panic!(
                "the downstream got a job the scenario never made: {}",
                job.job_id
            );
        };
        let at_ms = w.now_ms();
        let (lo, hi) = w.faults.latency_ms;
        let outage = w.faults.outages.iter().find(|(win, _)| win.contains(at_ms));
        let throttle = w.faults.throttles.iter().find(|(win, seller, _)| {
            win.contains(at_ms) && seller.as_ref().is_none_or(|s| *s == job.seller_id.as_str())
        });
        let rated = w
            .faults
            .seller_rates
            .iter()
            .find(|(seller, _)| *seller == job.seller_id.as_str())
            .is_some_and(|(seller, per_s)| w.over_rate(seller, *per_s, at_ms));
        // Calls under way as this one arrives, this one too, until the
        // downstream has served it.
        let busy = w.downstream_busy.fetch_add(1, Ordering::SeqCst) + 1;
        let over = w.faults.capacity.filter(|c| busy > c.calls);
        let (class, answer, took) = if over.is_some_and(|c| c.shed) {
            (
                "shed",
                Answer::Unreachable {
                    reason: "downstream answered 503 Service Unavailable".to_owned(),
                },
                1,
            )
        } else if let Some((_, kind)) = outage.filter(|(_, k)| w.outage_applies(*k)) {
            match kind {
                OutageKind::Status503 => (
                    "5xx",
                    Answer::Unreachable {
                        reason: "downstream answered 503 Service Unavailable".to_owned(),
                    },
                    w.random(lo, hi),
                ),
                OutageKind::Timeout => (
                    "timeout",
                    Answer::Unreachable {
                        reason: "downstream timed out".to_owned(),
                    },
                    w.faults.timeout.as_millis() as u64,
                ),
                OutageKind::Refused => (
                    "refused",
                    Answer::Unreachable {
                        reason: "could not connect to the downstream: refused".to_owned(),
                    },
                    1,
                ),
                OutageKind::Maintenance { retry_after_s } => (
                    "503-retry-after",
                    maintenance(&w.clock, *retry_after_s, w.faults.max_retry_after),
                    w.random(lo, hi),
                ),
                // Registered: the downstream did the job. The client's
                // timeout fired first, so what it reads is a timeout
                // (`downstream::client` maps reqwest's timeout to
                // `Unreachable`, as `OutageKind::Timeout` does).
                OutageKind::GaveUp { .. } => (
                    GAVE_UP,
                    Answer::Unreachable {
                        reason: "downstream timed out".to_owned(),
                    },
                    w.faults.timeout.as_millis() as u64,
                ),
            }
        } else if rated {
            let now = std::time::UNIX_EPOCH + Duration::from_micros(w.clock.unix_us());
            let ra = retry_after(vec!["1"], now, w.faults.max_retry_after);
            ("429", Answer::Throttled(ra), w.random(lo, hi))
        } else if let Some((_, _, kind)) = throttle {
            let now = std::time::UNIX_EPOCH + Duration::from_micros(w.clock.unix_us());
            let value = match kind {
                RetryAfterKind::Seconds(s) => s.to_string(),
                RetryAfterKind::Zero => "0".to_owned(),
                RetryAfterKind::PastDate => "Wed, 21 Oct 2015 07:28:00 GMT".to_owned(),
                RetryAfterKind::Garbage => "soon".to_owned(),
                RetryAfterKind::Huge => "99999999999999999999".to_owned(),
                RetryAfterKind::Absent => String::new(),
            };
            let values: Vec<&str> = if value.is_empty() {
                vec![]
            } else {
                vec![&value]
            };
            let ra = retry_after(values, now, w.faults.max_retry_after);
            ("429", Answer::Throttled(ra), w.random(lo, hi))
        } else {
            match w.poison[id] {
                Poison::Rejected => (
                    "4xx",
                    Answer::Fatal {
                        status: Some(400),
                        reason: "downstream answered 400 Bad Request".to_owned(),
                    },
                    w.random(lo, hi),
                ),
                Poison::AlwaysFails => (
                    "5xx",
                    Answer::Retryable {
                        reason: "downstream answered 500".to_owned(),
                    },
                    w.random(lo, hi),
                ),
                Poison::None => ("2xx", Answer::Done, w.random(lo, hi)),
            }
        };
        // Queueing beyond its capacity: each call as slow as the load is
        // over it.
        let took = match over {
            Some(cap) if !cap.shed => took * busy as u64 / cap.calls as u64,
            _ => took,
        };
        let at_us = w.clock.true_unix_us();
        // It holds a slot from now, answered or not (a kill cuts it short).
        let started = w.journal.call_started(
            id,
            at_ms,
            Arrival {
                job: id,
                seller: job.seller_id.as_str().to_owned(),
                cost: job.cost,
                at_us,
                granted_at_us,
            },
        );
        tokio::time::sleep(Duration::from_millis(took)).await;
        if let Some(tick) = w.faults.answer_tick_ms.filter(|&t| t > 0) {
            let us = w.clock.true_unix_us();
            let tick_us = tick * 1_000;
            tokio::time::sleep(Duration::from_micros((tick_us - us % tick_us) % tick_us)).await;
        }
        // Served: the downstream is done with it, whoever waits for it.
        w.downstream_busy.fetch_sub(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        w.journal.call(
            started,
            Call {
                process: self.process,
                job: id,
                seller: job.seller_id.as_str().to_owned(),
                cost: job.cost,
                at_ms,
                at_us,
                granted_at_us,
                class,
                end_ms: w.now_ms(),
            },
        );
        // A stalled process reads the answer when it resumes.
        self.stall.wait().await;
        answer
    }
}

/// The retry tiers and the dead-letter topic.
pub struct SimWriter {
    pub world: Arc<World>,
    pub dead: Arc<AtomicBool>,
    pub stall: Arc<Stall>,
    /// Partitions of each retry tier.
    pub tier_partitions: i32,
}

impl SimWriter {
    async fn ack(&self, topic: &str, bytes: usize, value: &Bytes) -> Result<(), WriteError> {
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        self.stall.wait().await;
        tokio::time::sleep(Duration::from_millis(self.world.random(1, 5))).await;
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        if bytes > self.world.faults.max_message_bytes {
            return Err(WriteError::TooLarge {
                topic: topic.to_owned(),
                reason: format!("{bytes} bytes"),
            });
        }
        let at = self.world.now_ms();
        let outage = self
            .world
            .faults
            .produce_outages
            .iter()
            .any(|w| w.contains(at));
        if outage || self.world.chance(self.world.faults.write_failure) {
            self.world.journal.write_failed(value, at, outage);
            return Err(WriteError::Failed {
                topic: topic.to_owned(),
                reason: "broker did not acknowledge".to_owned(),
            });
        }
        Ok(())
    }
}

/// Bytes a copy takes on the wire: value, key and the worker's headers.
fn wire_bytes(original: &OriginalRecord, headers: usize) -> usize {
    original.value.len() + original.key.as_ref().map_or(0, Vec::len) + headers
}

impl Writer for SimWriter {
    async fn dead_letter(
        &self,
        _topic: &str,
        original: &OriginalRecord,
        verdict: &Verdict<'_>,
        with_value: bool,
    ) -> Result<(), WriteError> {
        let reason = verdict.reason;
        let size = if with_value {
            wire_bytes(original, 200 + reason.len().min(1024))
        } else {
            200
        };
        self.ack("dlq", size, &original.value).await?;
        self.world.journal.dead_letter(&original.value, reason);
        Ok(())
    }

    async fn to_retry_topic(
        &self,
        topic: &str,
        original: &OriginalRecord,
        not_before_unix_ms: u64,
        release_at_unix_ms: u64,
        attempts: u32,
    ) -> Result<(), WriteError> {
        self.world
            .journal
            .retry_begun(&original.value, self.world.now_ms());
        self.ack(topic, wire_bytes(original, 200), &original.value)
            .await?;
        let key = original.key.clone();
        let partition = key
            .as_ref()
            .map_or(0, |k| k.iter().map(|&b| i32::from(b)).sum::<i32>())
            .rem_euclid(self.tier_partitions);
        let rec = SimRecord {
            key,
            value: original.value.clone(),
            headers: RetryHeaders {
                not_before_unix_ms: Some(not_before_unix_ms),
                release_at_unix_ms: Some(release_at_unix_ms),
                attempts,
                error: None,
                original: Some(Position {
                    topic: original.origin.topic.clone(),
                    partition: original.origin.partition,
                    offset: original.origin.offset,
                }),
            },
        };
        self.world
            .journal
            .retried(&original.value, self.world.now_ms());
        let mut broker = self.world.broker.lock().unwrap_or_else(|p| p.into_inner());
        broker.append(&(topic.to_owned(), partition), rec);
        Ok(())
    }
}

/// Why the simulated Redis did not answer.
#[derive(Debug, thiserror::Error)]
pub enum SimRedisError {
    #[error("connection refused (simulated outage)")]
    Down,
    #[error("timed out (simulated hang)")]
    Hung,
}

/// What a charged request released, as the store decided it: its units
/// from the grant's go-at, a pacer's one interval apart (the interval
/// `Pace::interval_us` gives the engine).
fn released(q: &JobsRequest, r: &JobsReply) -> Release {
    let key = &q.block.key;
    let seller = key
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map_or(key.as_str(), |(tag, _)| tag);
    Release {
        seller: seller.to_owned(),
        first_us: r.head.go_at_us as u64,
        units: r.head.granted as u64,
        interval_us: q
            .rules
            .iter()
            .filter_map(|(_, rule)| rule.pace_interval_us())
            .max()
            .unwrap_or(0),
    }
}

/// How often (virtual ms) a world with partial losses copies the keys
/// they put back.
pub const COPY_EVERY_MS: u64 = 20;

/// Copies of Redis' keys (or some of them), one per [`COPY_EVERY_MS`],
/// oldest first, for a fault that puts an older one back.
#[derive(Debug)]
pub struct Copies<T>(std::collections::VecDeque<(u64, T)>);

impl<T> Default for Copies<T> {
    fn default() -> Self {
        Copies(Default::default())
    }
}

impl<T: Clone> Copies<T> {
    /// The newest copy at least `back_ms` older than `t` (virtual ms).
    fn older(&self, t: u64, back_ms: u64) -> Option<T> {
        self.0
            .iter()
            .rev()
            .find(|(copied, _)| copied + back_ms <= t)
            .map(|(_, c)| c.clone())
    }

    /// Keeps a copy made by `copy` at `at` when one is due, and drops
    /// those older than the longest of `faults` (at, ms back) reaches.
    fn keep(&mut self, at: u64, faults: &[(u64, u64)], copy: impl FnOnce() -> T) {
        if self
            .0
            .back()
            .is_some_and(|(last, _)| at < last + COPY_EVERY_MS)
        {
            return;
        }
        self.0.push_back((at, copy()));
        let reach = faults.iter().map(|f| f.1).max().unwrap_or(0);
        while self
            .0
            .get(1)
            .is_some_and(|(t, _)| t + reach + COPY_EVERY_MS < at)
        {
            self.0.pop_front();
        }
    }

    /// A copy from before a loss is not the state after it.
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// The faults of `faults` (at, ms back) due by `at` that `applied` has not
/// counted yet, which it now does.
fn newly_due(
    faults: &[(u64, u64)],
    applied: &std::sync::atomic::AtomicUsize,
    at: u64,
) -> Vec<(u64, u64)> {
    let due: Vec<(u64, u64)> = faults.iter().copied().filter(|&(t, _)| t <= at).collect();
    let done = applied.swap(due.len(), Ordering::SeqCst);
    due.into_iter().skip(done).collect()
}

/// The Redis timeout the simulation models: a hung Redis fails a call
/// after this long (`SimStore::reach`).
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(1);

/// An empty Redis for a world: the limiter as the product runs it on
/// Redis 7, a Functions library called with FCALL (`RedisStore` falls back
/// to EVAL only on older servers).
pub fn sim_redis() -> EmbeddedRedis {
    EmbeddedRedis::new(Mode::Functions).unwrap_or_else(|e| panic!("the embedded Redis: {e}"))
}

/// Redis running the production Lua ([`EmbeddedRedis`]) on the store's
/// clock, which does not jump; the calls' arguments are built and their
/// replies read by the product's own code. A script error is a defect the
/// simulation reports (a panic of the run), not a Redis fault: the
/// engine never sends a call the scripts refuse.
#[derive(Clone)]
pub struct SimStore {
    pub world: Arc<World>,
    pub dead: Arc<AtomicBool>,
    /// The process's id in the fleet ([`World::members`]).
    pub process: u64,
    pub stall: Arc<Stall>,
}

/// A call that reached Redis: the instant its script runs (Redis' clock),
/// and what becomes of its reply.
struct Trip {
    at_us: u64,
    /// When the caller sent it: its timeout runs from then.
    sent: tokio::time::Instant,
    /// A hang: half the time the script ran before it (see
    /// [`SimStore::reach_or_lose`]).
    hung: bool,
    /// The reply's way back through a slow Redis; zero outside one.
    back: Duration,
}

impl SimStore {
    /// Reaches Redis through the seed's faults; the instant it answers
    /// at, on its clock, and the reply's way back ([`SimStore::answer`]).
    async fn reach(&self) -> Result<Trip, SimRedisError> {
        let trip = self.reach_or_lose().await?;
        if trip.hung {
            // Not a jobs call: the hang came before the script.
            tokio::time::sleep(REDIS_TIMEOUT).await;
            return Err(SimRedisError::Hung);
        }
        Ok(trip)
    }

    /// As [`reach`](Self::reach), except that in a hang, half the time,
    /// the script runs before the hang and only its reply is lost:
    /// `Trip::hung` then, and the caller runs it, waits out the timeout
    /// and fails. In a slow window ([`Faults::redis_slow`]) the call takes
    /// its way out first: past the timeout, the caller gives up before the
    /// script runs (a call that reaches the server after its caller gave
    /// up is refused by its deadline, `lua/jobs.lua`; not modelled: one
    /// that runs late all the same, before the first reply taught the
    /// replica Redis' clock).
    async fn reach_or_lose(&self) -> Result<Trip, SimRedisError> {
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        self.stall.wait().await;
        let w = &self.world;
        let sent = tokio::time::Instant::now();
        let (lo, hi) = w.faults.redis_latency_us;
        tokio::time::sleep(Duration::from_micros(w.random(lo, hi))).await;
        let mut at = w.now_ms();
        let mut back = Duration::ZERO;
        if let Some(&(_, (lo, hi))) = w.faults.redis_slow.iter().find(|(win, _)| win.contains(at)) {
            let out = Duration::from_millis(w.random(lo, hi));
            back = Duration::from_millis(w.random(lo, hi));
            if sent.elapsed() + out >= REDIS_TIMEOUT {
                tokio::time::sleep_until(sent + REDIS_TIMEOUT).await;
                w.journal.with(|log| log.reach.slow_timeouts += 1);
                return Err(SimRedisError::Hung);
            }
            tokio::time::sleep(out).await;
            at = w.now_ms();
        }
        let cut = w.cut_off(self.process, at);
        if cut.is_some() {
            w.journal.with(|log| log.reach.replica_cut_offs += 1);
        }
        let hung = cut == Some(ReplicaFault::Hung)
            || w.faults.redis_hangs.iter().any(|win| win.contains(at));
        if hung && w.random(0, 1) == 0 {
            tokio::time::sleep(REDIS_TIMEOUT).await;
            return Err(SimRedisError::Hung);
        }
        if cut == Some(ReplicaFault::Down)
            || w.faults.redis_errors.iter().any(|win| win.contains(at))
        {
            return Err(SimRedisError::Down);
        }
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        // A loss is applied when Redis is next reached: nobody can tell
        // the difference before.
        let due = w.faults.state_losses.iter().filter(|&&t| t <= at).count();
        if w.losses.swap(due, Ordering::SeqCst) < due {
            self.redis().flushall();
            // A copy from before the loss is not the state after it.
            w.copies.lock().unwrap_or_else(|p| p.into_inner()).clear();
            w.snapshots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        self.fail_over_and_copy(at);
        self.roll_back_and_copy(at);
        Ok(Trip {
            at_us: w.clock.true_unix_us(),
            sent,
            hung,
            back,
        })
    }

    /// The reply of a call whose script ran: back through a slow Redis,
    /// it arrives, or its caller's timeout fires first (the script ran;
    /// its reply is lost).
    async fn answer(&self, trip: &Trip) -> Result<(), SimRedisError> {
        if trip.back.is_zero() {
            return Ok(());
        }
        let w = &self.world;
        if trip.sent.elapsed() + trip.back >= REDIS_TIMEOUT {
            tokio::time::sleep_until(trip.sent + REDIS_TIMEOUT).await;
            w.journal.with(|log| log.reach.slow_replies_lost += 1);
            return Err(SimRedisError::Hung);
        }
        tokio::time::sleep(trip.back).await;
        if self.dead.load(Ordering::SeqCst) {
            never().await;
        }
        w.journal.with(|log| log.reach.slow_answers += 1);
        Ok(())
    }

    /// Applies the partial losses due by `at` (virtual ms): the sellers'
    /// state keys go back to the newest copy at least the loss's ms old
    /// (nothing when no copy is that old: a loss that finds no older copy
    /// loses nothing); then keeps a copy now, one per [`COPY_EVERY_MS`].
    fn roll_back_and_copy(&self, at: u64) {
        let w = &self.world;
        if w.faults.rollbacks.is_empty() {
            return;
        }
        let mut copies = w.copies.lock().unwrap_or_else(|p| p.into_inner());
        for (t, back_ms) in newly_due(&w.faults.rollbacks, &w.rollbacks, at) {
            if let Some(older) = copies.older(t, back_ms) {
                self.redis().put_back(&w.faults.rollback_keys, older);
                w.journal.with(|log| log.reach.rollbacks_applied += 1);
            }
        }
        copies.keep(at, &w.faults.rollbacks, || {
            self.redis().copy_keys(&w.faults.rollback_keys)
        });
    }

    /// Applies the failovers due by `at` (virtual ms): every key goes
    /// back to the newest copy at least the failover's ms old, under a new
    /// run of the server (none when no copy is that old: the replica
    /// promoted missed nothing, yet it is another server all the same);
    /// then keeps a copy now, one per [`COPY_EVERY_MS`].
    fn fail_over_and_copy(&self, at: u64) {
        let w = &self.world;
        if w.faults.failovers.is_empty() {
            return;
        }
        let mut copies = w.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        for (t, back_ms) in newly_due(&w.faults.failovers, &w.failovers, at) {
            let redis = self.redis();
            let older = copies.older(t, back_ms).unwrap_or_else(|| redis.snapshot());
            redis.take_over(older);
            w.journal.with(|log| log.reach.failovers_applied += 1);
        }
        copies.keep(at, &w.faults.failovers, || self.redis().snapshot());
    }

    fn redis(&self) -> std::sync::MutexGuard<'_, EmbeddedRedis> {
        self.world.redis.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A script that failed in the simulation: a defect of the scripts, of
/// the calls the product builds, or of the embedded Redis.
fn script_failed(what: &str, e: EmbeddedError) -> ! {
    panic!("the limiter's Lua failed on the simulation's Redis ({what}): {e}")
}

impl Store for SimStore {
    type Error = SimRedisError;

    /// Redis' clock, which does not jump: the replica learns it from every
    /// answer and from reading the pauses, so it is always known here.
    fn unix_us_at(&self, now: tokio::time::Instant) -> Option<u64> {
        Some(self.world.clock.true_unix_us_at(now))
    }

    async fn refund(&self, call: &RefundCall) -> Result<u64, SimRedisError> {
        let trip = self.reach().await?;
        let refunded = self
            .redis()
            .refund(call, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("{call:?}"), e));
        self.answer(&trip).await?;
        Ok(refunded)
    }

    /// A hang is a timeout: the script may have run.
    fn may_have_run(e: &SimRedisError) -> bool {
        matches!(e, SimRedisError::Hung)
    }

    async fn run_jobs(&self, call: &JobsCall) -> Result<Vec<JobsReply>, SimRedisError> {
        let trip = self.reach_or_lose().await?;
        let lost = trip.hung;
        // The record's life as the product sends it on Redis' clock.
        let life = call.now_us.is_none().then(|| call_life_us(REDIS_TIMEOUT));
        let answer = self
            .redis()
            .run_jobs(call, life, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("{call:?}"), e));
        if !call.dry_run {
            self.world.journal.with(|log| {
                log.jobs_calls += 1;
                for (q, r) in call.requests.iter().zip(&answer.replies) {
                    if r.head.status == 1 && r.head.granted > 0 {
                        log.released.push(released(q, r));
                    } else if r.head.status == 0 {
                        log.reach.denials += 1;
                    }
                }
                if matches!(answer.epoch, EpochFound::Lost | EpochFound::NewInstall) {
                    let new = answer.epoch == EpochFound::NewInstall;
                    log.epochs_written.push((self.world.now_ms(), new));
                }
                log.reach.losses_found += u64::from(answer.epoch == EpochFound::Lost);
                log.reach.rollbacks_found += u64::from(answer.epoch == EpochFound::RolledBack);
                log.reach.new_installs += u64::from(answer.epoch == EpochFound::NewInstall);
                log.reach.lost_replies += u64::from(lost);
            });
        }
        if lost {
            // The script ran; its reply never arrives.
            tokio::time::sleep(REDIS_TIMEOUT).await;
            return Err(SimRedisError::Hung);
        }
        self.answer(&trip).await?;
        if !call.dry_run && !trip.back.is_zero() {
            let now_us = self.world.clock.true_unix_us();
            self.world.journal.with(|log| {
                for (q, r) in call.requests.iter().zip(&answer.replies) {
                    if r.head.status == 1 && r.head.granted > 0 {
                        let late = now_us.saturating_sub(r.head.now_us as u64);
                        log.learnt_late.push((released(q, r), late));
                    }
                }
            });
        }
        Ok(answer.replies)
    }

    async fn read_epoch(&self, key: &str) -> Result<Option<u64>, SimRedisError> {
        let trip = self.reach().await?;
        let epoch = self.redis().read_epoch(key, trip.at_us);
        self.answer(&trip).await?;
        Ok(epoch)
    }

    async fn read_rollbacks(
        &self,
        key: &str,
        after_us: u64,
    ) -> Result<Vec<RollbackFound>, SimRedisError> {
        let trip = self.reach().await?;
        let found = self.redis().read_rollbacks(key, after_us, trip.at_us);
        self.answer(&trip).await?;
        Ok(found)
    }

    async fn restore(&self, call: &RestoreCall) -> Result<Vec<i64>, SimRedisError> {
        let trip = self.reach().await?;
        let reply = self
            .redis()
            .restore(call, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("restore {call:?}"), e));
        self.answer(&trip).await?;
        Ok(reply)
    }

    async fn begin_install(
        &self,
        epoch: &str,
        server: Option<&str>,
    ) -> Result<bool, SimRedisError> {
        let trip = self.reach().await?;
        let wrote = self
            .redis()
            .begin_install(epoch, server, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("install {epoch}"), e));
        // The new install's epoch, written before its first jobs call.
        if wrote {
            self.world.journal.with(|log| {
                log.epochs_written.push((self.world.now_ms(), true));
                log.reach.new_installs += 1;
            });
        }
        self.answer(&trip).await?;
        Ok(wrote)
    }

    async fn release(&self, key: &str, leases: &[String]) -> Result<u64, SimRedisError> {
        let trip = self.reach().await?;
        let reply = self
            .redis()
            .release(key, leases, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("release {key} {leases:?}"), e));
        self.answer(&trip).await?;
        Ok(reply)
    }

    async fn cancel_jobs(&self, call: &JobsCall) -> Result<Vec<i64>, SimRedisError> {
        let trip = self.reach().await?;
        let reply = self
            .redis()
            .cancel_jobs(call, call_life_us(REDIS_TIMEOUT), trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("cancel {call:?}"), e));
        self.answer(&trip).await?;
        Ok(reply)
    }

    async fn block(
        &self,
        key: &BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> Result<u64, SimRedisError> {
        let trip = self.reach().await?;
        let reply = self
            .redis()
            .block(key, now_us, dur_us, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("block {key:?}"), e));
        self.answer(&trip).await?;
        Ok(reply)
    }

    async fn block_learning(
        &self,
        key: &BlockAt,
        call: &BlockCall,
    ) -> Result<Blocked, SimRedisError> {
        let trip = self.reach().await?;
        let blocked = self
            .redis()
            .block_learning(key, call, trip.at_us)
            .unwrap_or_else(|e| script_failed(&format!("block {key:?} {call:?}"), e));
        if blocked.learnt.is_some_and(|l| l.dropped) {
            self.world.journal.with(|log| log.reach.learnt_drops += 1);
        }
        self.answer(&trip).await?;
        Ok(blocked)
    }
}

/// The limiter as the engine sees it, recording each of its calls (the
/// downstream slots an ask holds, for invariant 4).
/// The limiter port as production wires it: job lists go through a
/// [`Coalescer`] (several sellers' asks in one script call, `redis.coalesce_*`),
/// everything else straight to the limiter; each ask is journalled.
pub struct SimPermits {
    pub inner: Coalescer<SimStore>,
    pub world: Arc<World>,
}

/// A pacer's grant, for the checker to tell its calls' decision from
/// their go-at ([`Log::paced`]).
fn journal_pace(log: &mut Log, seller: &str, decision: &BatchDecision) {
    if let BatchDecision::Granted(g) = decision {
        if let Some(pace) = g.pace {
            log.paced.entry(seller.to_owned()).or_default().push((
                pace.first_at_us,
                pace.interval_us,
                g.units,
                g.decided_at_us,
            ));
        }
    }
}

/// Records an ask's end when its future ends, answered or dropped.
struct AskGuard<'a> {
    world: &'a World,
    index: usize,
}

impl Drop for AskGuard<'_> {
    fn drop(&mut self) {
        let now = self.world.now_ms();
        self.world.journal.with(|log| {
            if let Some(ask) = log.asks.get_mut(self.index) {
                ask.to_ms = Some(now);
            }
        });
    }
}

impl Permits for SimPermits {
    async fn acquire(&self, seller: &str, n: u64) -> Result<Decision, PermitError> {
        Permits::acquire(&self.inner, seller, n).await
    }

    async fn block(
        &self,
        seller: &str,
        dur: Duration,
        decided_us: Option<u64>,
    ) -> Result<Option<Learnt>, PermitError> {
        Permits::block(&self.inner, seller, dur, decided_us).await
    }

    async fn release(&self, seller: &str, leases: &[String]) -> Result<(), PermitError> {
        Permits::release(&self.inner, seller, leases).await
    }

    // Granted jobs a revoke or a stop left uncalled give their units back
    // in the simulation as in the product (the refund runs in its Redis).
    async fn give_back(
        &self,
        seller: &str,
        receipt: &Receipt,
        unused: Unused,
    ) -> Result<(), PermitError> {
        Permits::give_back(&self.inner, seller, receipt, unused).await
    }

    async fn acquire_jobs(
        &self,
        seller: &str,
        costs: &[u64],
    ) -> Result<BatchDecision, PermitError> {
        let w = &self.world;
        let from_ms = w.now_ms();
        let index = w.journal.with(|log| {
            log.limiter_requests += 1;
            log.asks.push(Ask {
                from_ms,
                to_ms: None,
                jobs: costs.len(),
                seller: seller.to_owned(),
            });
            log.asks.len() - 1
        });
        let guard = AskGuard { world: w, index };
        let answer = Permits::acquire_jobs(&self.inner, seller, costs).await;
        drop(guard);
        if let Ok(decision) = &answer {
            let at = w.now_ms();
            w.journal.with(|log| {
                log.limiter_answered_ms.push(at);
                journal_pace(log, seller, decision);
            });
        }
        answer
    }

    /// One request of the engine (its asks of one turn), journalled as
    /// such and ask by ask; each ask ends when its answer comes (or the
    /// request is dropped: a kill).
    fn acquire_jobs_many<'a>(
        &'a self,
        asks: &'a [(Arc<str>, Vec<u64>)],
    ) -> impl Stream<Item = (usize, Result<BatchDecision, PermitError>)> + Send + 'a {
        let w = &self.world;
        let from_ms = w.now_ms();
        let mut guards: Vec<Option<AskGuard<'a>>> = w.journal.with(|log| {
            log.limiter_requests += 1;
            asks.iter()
                .map(|(seller, costs)| {
                    log.asks.push(Ask {
                        from_ms,
                        to_ms: None,
                        jobs: costs.len(),
                        seller: seller.to_string(),
                    });
                    Some(AskGuard {
                        world: w,
                        index: log.asks.len() - 1,
                    })
                })
                .collect()
        });
        Permits::acquire_jobs_many(&self.inner, asks).map(move |(i, answer)| {
            drop(guards.get_mut(i).and_then(Option::take));
            if let Ok(decision) = &answer {
                let at = w.now_ms();
                w.journal.with(|log| {
                    log.limiter_answered_ms.push(at);
                    journal_pace(log, &asks[i].0, decision);
                });
            }
            (i, answer)
        })
    }

    fn rules_of(&self, seller: &str) -> Option<(Vec<Rule>, Vec<Rule>)> {
        Permits::rules_of(&self.inner, seller)
    }

    fn max_in_flight(&self, seller: &str) -> Option<u32> {
        Permits::max_in_flight(&self.inner, seller)
    }

    fn share(&self, seller: &str) -> throttle_worker::limiter::Share {
        Permits::share(&self.inner, seller)
    }

    fn store_unix_ms(&self, now: tokio::time::Instant) -> Option<u64> {
        Permits::store_unix_ms(&self.inner, now)
    }

    /// The scenario's pauses, on the world's time (as if every replica
    /// read them the instant they were set); an end is told on the
    /// engine's wall clock, which may have jumped.
    fn paused(&self, seller: &str, now_ms: u64) -> Option<Pause> {
        let at = self.world.now_ms();
        self.world
            .faults
            .pauses
            .iter()
            .filter(|(w, who, _)| w.contains(at) && who.as_deref().is_none_or(|s| s == seller))
            .map(|(w, _, ends)| Pause {
                reason: "sim".to_owned(),
                since_ms: 0,
                until_ms: ends.then(|| now_ms + (w.to_ms - at)),
            })
            .max_by_key(|p| p.until_ms.unwrap_or(u64::MAX))
    }

    fn describe(&self, seller: &str) -> SellerInfo {
        Permits::describe(&self.inner, seller)
    }
}

/// A record value for job `id`.
pub fn job_value(id: usize, seller: &str, cost: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"job_id":"job-{id}","seller_id":"{seller}","payload":{{"n":{id}}},"cost":{cost}}}"#
    ))
}

/// [`job_value`] naming a `priority` (none when 0: the default) and a
/// product (`payload.sku`), if any.
pub fn job_value_with(
    id: usize,
    seller: &str,
    cost: u64,
    priority: u8,
    sku: Option<&str>,
) -> Bytes {
    if priority == 0 && sku.is_none() {
        return job_value(id, seller, cost);
    }
    let sku = sku.map_or(String::new(), |s| format!(r#","sku":"{s}""#));
    let priority = match priority {
        0 => String::new(),
        p => format!(r#","priority":{p}"#),
    };
    Bytes::from(format!(
        r#"{{"job_id":"job-{id}","seller_id":"{seller}","payload":{{"n":{id}{sku}}},"cost":{cost}{priority}}}"#
    ))
}
