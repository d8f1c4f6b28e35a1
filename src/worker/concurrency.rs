//! Adaptive downstream concurrency: how many calls this replica lets out
//! at once, learnt from the downstream's own answers, between
//! `downstream.min_concurrency` and `downstream.concurrency` (the ceiling).
//!
//! A fixed concurrency is wrong both ways: above what the downstream can
//! serve it answers 503s and timeouts (each one an attempt a job spends),
//! below it capacity sits idle. The limit here moves the way TCP's window
//! does (and Netflix's concurrency-limits AIMD), on two signals that
//! concern no one seller:
//! - **overload**: a call that reached nothing or was shed (502, 503, 504,
//!   a timeout, a refused connection). The limit drops to 90 % of the
//!   calls that were out when that call started (the level that was too
//!   many), once per episode: calls that started before the last drop, or
//!   within a round trip of it, say nothing new.
//! - **latency**: the average of a window of successful calls, against the
//!   lowest window average seen (the downstream unloaded; never aged, or a
//!   load held for long would become the norm; at the floor, a slow window
//!   replaces it: there is nothing left to give back, so a downstream
//!   slower whatever we do has a new norm).
//!   Beyond `downstream.latency_tolerance` times that, the downstream is
//!   queueing our calls, and the limit drops as for an overload.
//!
//! It grows only while it binds (every slot was taken when a call
//! started), so an idle replica does not inflate it: by one per call at
//! first (doubling per round trip, a slow start), then by one per round
//! trip, and within ±20 % of the level of the last overload by 1/160 per
//! call, so the limit takes about 16 round trips to climb back the 10 % it
//! gave up: each probe past the downstream's capacity costs a call or two,
//! which keeps the share of shed calls near 1/(16 × limit). After 24 round
//! trips near that level with no overload, the level is stale (another
//! replica stopped sending, the downstream grew): one per round trip again.
//!
//! Each replica learns on its own: the fleet's total settles where the
//! downstream's answers say, without any coordination. The component does
//! no I/O: the engine feeds it each call's sample and applies the limit it
//! returns to the slot pool.

use std::time::Duration;

use tokio::time::Instant;

/// Share of the overloaded level the limit drops to.
const DECREASE: f64 = 0.9;
/// Growth per call near the level of the last overload.
const NEAR_STEP: f64 = 1.0 / 160.0;
/// "Near" the last overload's level: within this share of it.
const NEAR: f64 = 0.2;
/// Round trips near the last overload's level with every slot in use and
/// no new overload: then that level is stale (another replica stopped
/// sending, the downstream grew) and the limit grows by one per round trip
/// again. Longer than the ~16 round trips a probe back to the level takes.
const STALE_ROUND_TRIPS: f64 = 24.0;
/// Fewest successful calls in a latency window.
const MIN_WINDOW: usize = 4;
/// A change of the limit this large (a share of the last one logged) is
/// logged with its reason.
const LOUD: f64 = 0.25;

/// The settings of the adaptive limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSettings {
    /// Never fewer calls out than this.
    pub floor: usize,
    /// `downstream.concurrency`: never more.
    pub ceiling: usize,
    /// How much slower than unloaded the downstream may answer before the
    /// limit drops (2.0: twice the unloaded latency).
    pub latency_tolerance: f64,
}

/// One downstream call, as its answer came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub started_at: Instant,
    pub latency: Duration,
    /// Slots of this replica taken when the call started, its own too.
    pub in_flight: usize,
    /// Shed or unreached (502, 503, 504, timeout, refused): the downstream
    /// had too much, whoever the job.
    pub overload: bool,
}

/// Why the limit moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// A call was shed or reached nothing.
    Overload { in_flight: usize },
    /// A window of calls answered beyond the tolerance.
    Latency {
        window: Duration,
        baseline: Duration,
    },
    /// Every slot was taken and the downstream kept up.
    Growth,
}

impl Reason {
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Overload { .. } => "overload",
            Reason::Latency { .. } => "latency",
            Reason::Growth => "growth",
        }
    }
}

/// A change of the limit in slots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    pub from: usize,
    pub to: usize,
    pub reason: Reason,
    /// Large enough to be logged (a quarter of the limit last logged, or
    /// the floor or ceiling reached): the small steps of the search are
    /// only counted.
    pub loud: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    SlowStart,
    Avoidance,
}

/// The adaptive limit (see the module doc).
#[derive(Debug)]
pub struct AdaptiveLimit {
    settings: AdaptiveSettings,
    /// Fractional: growth adds fractions of a slot.
    limit: f64,
    phase: Phase,
    /// The level of the last overload (0: none yet, or stale).
    overloaded_at: f64,
    /// Calls that found every slot in use and succeeded since the last drop.
    grown_since_drop: f64,
    /// When the limit last dropped: calls that started before say nothing
    /// new.
    decreased_at: Option<Instant>,
    /// The window of successful calls being averaged.
    window_sum: Duration,
    window_calls: usize,
    /// The earliest start among the window's calls.
    window_from: Option<Instant>,
    /// The lowest window average: the downstream unloaded.
    baseline: Option<Duration>,
    /// The limit in the last log line.
    logged: usize,
}

impl AdaptiveLimit {
    pub fn new(settings: AdaptiveSettings) -> AdaptiveLimit {
        debug_assert!(
            1 <= settings.floor && settings.floor <= settings.ceiling,
            "{settings:?}"
        );
        AdaptiveLimit {
            settings,
            limit: settings.floor as f64,
            phase: Phase::SlowStart,
            overloaded_at: 0.0,
            grown_since_drop: 0.0,
            decreased_at: None,
            window_sum: Duration::ZERO,
            window_calls: 0,
            window_from: None,
            baseline: None,
            logged: settings.floor,
        }
    }

    /// The limit, in slots.
    pub fn slots(&self) -> usize {
        (self.limit.floor() as usize).clamp(self.settings.floor, self.settings.ceiling)
    }

    /// The lowest window average seen: the downstream unloaded.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline
    }

    /// Learns from one call; returns the change of the limit, if any.
    pub fn on_sample(&mut self, now: Instant, s: Sample) -> Option<Change> {
        let from = self.slots();
        let reason = if s.overload {
            // One drop per episode: calls that started before the last
            // drop, and calls shed within a round trip of it (a shed call
            // is answered at once, and the slots it frees are taken again
            // at once: without the round trip, one overload would cut the
            // limit once per shed call, down to the floor).
            let rtt = self.baseline.unwrap_or_default();
            if self
                .decreased_at
                .is_some_and(|d| s.started_at < d || now < d + rtt)
            {
                return None;
            }
            let level = self.limit.min(s.in_flight as f64);
            self.decrease(now, level);
            Reason::Overload {
                in_flight: s.in_flight,
            }
        } else if let Some(reason) = self.window(now, s) {
            reason
        } else {
            if s.in_flight >= from {
                self.grow();
            }
            Reason::Growth
        };
        let to = self.slots();
        if to == from {
            return None;
        }
        let bound = to == self.settings.floor || to == self.settings.ceiling;
        let loud = bound || to.abs_diff(self.logged) as f64 >= LOUD * self.logged as f64;
        if loud {
            self.logged = to;
        }
        Some(Change {
            from,
            to,
            reason,
            loud,
        })
    }

    /// Adds a successful call to the latency window; when the window is
    /// full, judges it against the baseline.
    fn window(&mut self, now: Instant, s: Sample) -> Option<Reason> {
        self.window_sum += s.latency;
        self.window_calls += 1;
        let from = *self.window_from.get_or_insert(s.started_at);
        self.window_from = Some(from.min(s.started_at));
        if self.window_calls < self.slots().max(MIN_WINDOW) {
            return None;
        }
        let avg = self.window_sum / self.window_calls as u32;
        let first = self.window_from.take().unwrap_or(from);
        self.window_sum = Duration::ZERO;
        self.window_calls = 0;
        let baseline = self.baseline;
        let slow = baseline
            .is_some_and(|b| avg.as_secs_f64() > self.settings.latency_tolerance * b.as_secs_f64());
        // The lowest window seen is the downstream unloaded. It is not
        // forgotten with time, or a load held for long would become the
        // norm, window after window. At the floor there is nothing left to
        // give back: a downstream slower whatever we do has a new unloaded
        // latency, and it replaces the old one.
        if !slow {
            self.baseline = Some(baseline.map_or(avg, |b| b.min(avg)));
        } else if self.slots() == self.settings.floor {
            self.baseline = Some(avg);
        }
        let baseline = baseline?;
        // A window that began before the last drop shows the load before
        // it: already answered.
        let fresh = self.decreased_at.is_none_or(|d| first >= d);
        if slow && fresh {
            self.decrease(now, self.limit);
            return Some(Reason::Latency {
                window: avg,
                baseline,
            });
        }
        None
    }

    fn decrease(&mut self, now: Instant, level: f64) {
        self.overloaded_at = level;
        self.grown_since_drop = 0.0;
        self.limit = (level * DECREASE).max(self.settings.floor as f64);
        self.phase = Phase::Avoidance;
        self.decreased_at = Some(now);
    }

    fn grow(&mut self) {
        self.grown_since_drop += 1.0;
        if self.grown_since_drop > STALE_ROUND_TRIPS * self.limit {
            self.overloaded_at = 0.0;
        }
        let near = self.overloaded_at > 0.0
            && (self.limit - self.overloaded_at).abs() <= NEAR * self.overloaded_at;
        let step = match self.phase {
            Phase::SlowStart => 1.0,
            Phase::Avoidance if near => NEAR_STEP,
            Phase::Avoidance => 1.0 / self.limit.max(1.0),
        };
        self.limit = (self.limit + step).min(self.settings.ceiling as f64);
        // Far past the last overload without another: the downstream has
        // grown, that level says nothing any more.
        if self.limit > (1.0 + NEAR) * self.overloaded_at {
            self.overloaded_at = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn limit(floor: usize, ceiling: usize) -> AdaptiveLimit {
        AdaptiveLimit::new(AdaptiveSettings {
            floor,
            ceiling,
            latency_tolerance: 2.0,
        })
    }

    fn ok(at: Instant, in_flight: usize, latency: Duration) -> Sample {
        Sample {
            started_at: at,
            latency,
            in_flight,
            overload: false,
        }
    }

    fn shed(at: Instant, in_flight: usize) -> Sample {
        Sample {
            started_at: at,
            latency: MS,
            in_flight,
            overload: true,
        }
    }

    #[test]
    fn slow_start_grows_by_one_per_call_while_every_slot_is_taken() {
        let mut l = limit(1, 64);
        let t = Instant::now();
        for want in 2..=5 {
            let c = l.on_sample(t, ok(t, l.slots(), 10 * MS)).expect("grew");
            assert_eq!((c.to, c.reason), (want, Reason::Growth));
        }
        // A call that found a slot free says nothing of more.
        assert_eq!(l.on_sample(t, ok(t, 2, 10 * MS)), None);
        assert_eq!(l.slots(), 5);
    }

    #[test]
    fn an_overload_drops_to_nine_tenths_of_what_was_out_once_per_episode() {
        let mut l = limit(1, 64);
        let t0 = Instant::now();
        for _ in 0..19 {
            l.on_sample(t0, ok(t0, l.slots(), 10 * MS));
        }
        assert_eq!(l.slots(), 20);
        let t1 = t0 + 50 * MS;
        let c = l.on_sample(t1, shed(t0, 10)).expect("dropped");
        assert_eq!((c.from, c.to), (20, 9));
        assert!(c.loud, "more than a quarter");
        // Other calls of the same episode (started before the drop).
        assert_eq!(l.on_sample(t1 + MS, shed(t0 + MS, 20)), None);
        // Started after the drop, shed within a round trip (10 ms) of it:
        // the same episode still.
        assert_eq!(l.on_sample(t1 + 9 * MS, shed(t1 + MS, 9)), None);
        // A round trip later: a new episode.
        let c = l
            .on_sample(t1 + 11 * MS, shed(t1 + 10 * MS, 9))
            .expect("again");
        assert_eq!(c.to, 8);
    }

    #[test]
    fn never_below_the_floor_nor_above_the_ceiling() {
        let mut l = limit(3, 6);
        let mut t = Instant::now();
        for _ in 0..50 {
            l.on_sample(t, ok(t, l.slots(), 10 * MS));
            assert!((3..=6).contains(&l.slots()));
        }
        assert_eq!(l.slots(), 6);
        for _ in 0..50 {
            t += MS;
            l.on_sample(t, shed(t, 6));
            assert!((3..=6).contains(&l.slots()));
        }
        assert_eq!(l.slots(), 3);
    }

    #[test]
    fn near_the_last_overload_it_climbs_back_in_about_sixteen_round_trips() {
        let mut l = limit(1, 64);
        let t = Instant::now();
        for _ in 0..19 {
            l.on_sample(t, ok(t, l.slots(), 10 * MS));
        }
        l.on_sample(t + MS, shed(t + MS, 20));
        assert_eq!(l.slots(), 18);
        // 18 → 20 by 1/160 per call: 320 calls, 16 round trips of 20.
        let mut calls = 0;
        while l.slots() < 20 {
            let at = t + 2 * MS;
            l.on_sample(at, ok(at, l.slots(), 10 * MS));
            calls += 1;
        }
        assert!((300..=330).contains(&calls), "{calls} calls");
    }

    #[test]
    fn calls_slower_than_the_tolerance_drop_the_limit() {
        let mut l = limit(1, 64);
        let mut t = Instant::now();
        // Unloaded: 10 ms windows while it grows to 8.
        while l.slots() < 8 {
            t += MS;
            l.on_sample(t, ok(t, l.slots(), 10 * MS));
        }
        assert_eq!(l.baseline(), Some(10 * MS));
        // Queueing: 25 ms, beyond twice the baseline, for a whole window.
        let mut change = None;
        for _ in 0..64 {
            t += MS;
            let c = l.on_sample(t, ok(t, l.slots(), 25 * MS));
            change = change.or(c.filter(|c| c.reason != Reason::Growth));
        }
        let c = change.expect("dropped");
        let Reason::Latency { window, baseline } = c.reason else {
            panic!("{c:?}");
        };
        assert!(window > 20 * MS, "{window:?}");
        assert_eq!(baseline, 10 * MS);
        assert!(c.to < c.from);
        // Within the tolerance (18 ms < 20 ms): it grows again.
        let before = l.slots();
        for _ in 0..400 {
            t += MS;
            l.on_sample(t, ok(t, l.slots(), 18 * MS));
        }
        assert!(l.slots() > before, "{} ≤ {before}", l.slots());
    }

    /// A closed loop: `replicas` limits against a downstream that sheds
    /// every call beyond `capacity` out at once; each round trip every
    /// replica sends what its limit allows. Returns the shed share and the
    /// goodput share of the capacity after the first `warm` round trips.
    fn shedding_loop(replicas: usize, capacity: usize, ceiling: usize) -> (f64, f64) {
        let mut ls: Vec<AdaptiveLimit> = (0..replicas).map(|_| limit(1, ceiling)).collect();
        let t0 = Instant::now();
        let (mut calls, mut shed_calls, mut served) = (0usize, 0usize, 0usize);
        let (rounds, warm) = (3000, 200);
        for round in 0..rounds {
            let start = t0 + 50 * MS * round as u32;
            let end = start + 50 * MS;
            let sent: Vec<usize> = ls.iter().map(AdaptiveLimit::slots).collect();
            let total: usize = sent.iter().sum();
            // The downstream serves the first `capacity` calls, spread
            // evenly over the replicas' sends; the rest are shed.
            let mut room = capacity;
            for (i, l) in ls.iter_mut().enumerate() {
                let mine = sent[i];
                let fair = (capacity * mine).div_ceil(total.max(1)).min(room);
                room -= fair;
                for k in 0..mine {
                    let s = if k < fair {
                        ok(start, mine, 50 * MS)
                    } else {
                        shed(start, mine)
                    };
                    l.on_sample(end, s);
                    if round >= warm {
                        calls += 1;
                        if k < fair {
                            served += 1;
                        } else {
                            shed_calls += 1;
                        }
                    }
                }
            }
        }
        let goodput = served as f64 / (capacity * (rounds - warm)) as f64;
        (shed_calls as f64 / calls as f64, goodput)
    }

    #[test]
    fn a_shedding_downstream_is_found_without_shedding_much() {
        // (replicas, hidden capacity, ceiling)
        for (replicas, capacity, ceiling) in [(2, 8, 32), (1, 8, 32), (4, 40, 64), (2, 100, 256)] {
            let (shed, goodput) = shedding_loop(replicas, capacity, ceiling);
            eprintln!(
                "{replicas} × ceiling {ceiling} against {capacity}: {:.2} % shed, goodput {:.3}",
                shed * 100.0,
                goodput
            );
            assert!(
                shed <= 0.05 && goodput >= 0.85,
                "{replicas} × ceiling {ceiling} against {capacity}: {:.1} % shed, goodput {:.2}",
                shed * 100.0,
                goodput
            );
        }
    }
}
