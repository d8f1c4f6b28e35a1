//! At `worker.max_buffered` jobs in memory the worker stops fetching, and
//! resumes once below 90 % of it: a throttled backlog stays in Kafka, not in
//! the worker's memory. The worker's events go to a subscriber of this
//! test's own (`Running::start_with_subscriber`); the counters it reads are
//! the process' (nextest runs each test in a process of its own).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::rule;
use crate::common::worker::{always_ok, job, policy, Bench, Downstream, Running};
use throttle_worker::telemetry::metrics::metrics;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Every `backpressure` event the worker logs: (paused, jobs buffered).
#[derive(Clone, Default)]
struct Transitions(Arc<Mutex<Vec<(bool, u64)>>>);

#[derive(Default)]
struct Fields {
    message: String,
    paused: Option<bool>,
    buffered: Option<u64>,
}

impl Visit for Fields {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "paused" {
            self.paused = Some(value);
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "buffered" {
            self.buffered = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Transitions {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        if f.message == "backpressure" {
            if let (Some(paused), Some(buffered)) = (f.paused, f.buffered) {
                self.0.lock().unwrap().push((paused, buffered));
            }
        }
    }
}

/// 400 jobs of one seller allowed 5 a second, `max_buffered` 40: the worker
/// pauses at 40 jobs in memory, resumes below 36 as jobs finish, and never
/// holds more than one fetch beyond the bound. Waits on what the worker
/// reports (its backpressure events, its received count, the downstream's
/// arrivals), not on a sleep that stands in for "a fetch happened".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fetching_pauses_at_max_buffered_and_resumes_below_ninety_percent() {
    let transitions = Transitions::default();
    let bench = Bench::new("backpressure", 2);
    let down = Downstream::start(always_ok()).await;
    let mut settings = bench.settings(&down.url);
    settings.worker.max_buffered = 40;
    settings.worker.max_inline_delay = Duration::from_secs(60);
    let records: Vec<_> = (0..400).map(|i| job(&format!("q-{i}"), "queued")).collect();
    bench.produce(&records).await;
    let w = Running::start_with_subscriber(
        settings,
        policy(vec![rule("fixed_window", 5, "1s", None)]),
        tracing::Dispatch::new(tracing_subscriber::registry().with(transitions.clone())),
    );
    // Until the worker has paused, resumed and paused again (a full cycle),
    // checking at every look that memory stays bounded: in memory at most
    // max_buffered (40) beyond what was done, plus what one fetch delivers
    // before the pause lands (at most another 40 here).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut most_held = 0;
    loop {
        // Received first: a job done between the two reads makes the
        // difference smaller, never larger than what was held.
        let received = metrics().jobs_received.get();
        let done = down.count() as u64;
        most_held = most_held.max(received.saturating_sub(done));
        assert!(
            received <= done + 40 + 40,
            "took {received} of 400 records with only {done} done and max_buffered 40"
        );
        let seen = transitions.0.lock().unwrap().clone();
        let cycles = seen.iter().filter(|(paused, _)| *paused).count();
        if cycles >= 2 && seen.iter().any(|(paused, _)| !paused) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no pause, resume, pause within 30 s: backpressure events {seen:?}, {received} received, {done} done"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let received = metrics().jobs_received.get();
    let done = down.count();
    w.stop().await;
    let seen = transitions.0.lock().unwrap().clone();
    println!(
        "backpressure: {received} records taken, {done} done, at most {most_held} held; events (paused, buffered): {seen:?}"
    );
    assert!(
        metrics().backpressure_pauses.get() >= 2,
        "the pause metric counts each pause"
    );
    for (paused, buffered) in &seen {
        if *paused {
            assert!(
                *buffered >= 40,
                "paused at {buffered} jobs, below max_buffered 40: {seen:?}"
            );
        } else {
            assert!(
                *buffered < 36,
                "resumed at {buffered} jobs, not below 90 % of 40: {seen:?}"
            );
        }
    }
    assert!(
        received < 400,
        "took all 400 records: fetching never stayed paused"
    );
}
