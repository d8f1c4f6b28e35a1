//! `throttle-worker demo`: the whole pipeline on one machine, with nothing
//! but a Redis: the mock Kafka broker and the downstream stub in this
//! process, N worker replicas as child processes of this binary (a real
//! consumer group), a Zipf-skewed load with a few malformed records, a live
//! view, and at the end a summary that checks the limits held and nothing
//! was lost.
//!
//! - [`plan`]: the sellers, their roles and rules, the replicas' config.
//! - [`replicas`]: the child processes, which never outlive the demo.
//! - [`scrape`]: the replicas' `/metrics`, parsed and summed.
//! - [`dlq`]: the dead-letter topic, followed and read to its end.
//! - [`check`]: busiest windows against the rules; every job accounted for.
//! - [`view`]: the live view (ratatui, or a plain table).
//! - [`limiter`]: `throttle-worker limiter demo`, the limiter alone.

pub mod check;
pub mod dlq;
pub mod limiter;
pub mod plan;
pub mod replicas;
pub mod scrape;
pub mod view;

pub use limiter::limiter_demo;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use indicatif::ProgressBar;
use tokio::sync::mpsc;

use crate::config::redact_url;
use crate::kafka::{DevBroker, RecordSink};
use crate::limiter::{Policy, RedisStore};
use crate::load::{self, LoadSpec};
use crate::stub::{Faults, Stub, StubConfig};

use self::check::{Accounting, SellerVerdict};
use self::dlq::{DeadLetters, DlqTail};
use self::plan::{Plan, WorkerSite};
use self::replicas::{Launch, Replicas};
use self::scrape::Fleet;
use self::view::{SellerRow, Snapshot, View};

/// How long the replicas may take to join the group and be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the pipeline may take to drain after the live phase: one full
/// window of the stub's throttle and a little more.
const DRAIN_TIMEOUT: Duration = plan::STUB_WINDOW_MAX.saturating_add(Duration::from_secs(5));

/// SIGTERM to exit: a worker's `shutdown_timeout` (5 s in the demo) and
/// closing its Kafka clients.
const STOP_GRACE: Duration = Duration::from_secs(12);

/// `throttle-worker demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How long the live phase lasts; the load runs for its first two
    /// thirds, the rest shows the throttled backlogs draining.
    #[arg(long, default_value = "45s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Worker replicas (child processes of this binary).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Sellers in the load (Zipf-skewed: seller-0 sends the most).
    #[arg(long, default_value_t = 12)]
    pub sellers: usize,
    /// Jobs per second the load produces.
    #[arg(long, default_value_t = 300.0)]
    pub rate: f64,
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// Keep the replicas' configs and logs even when every check holds
    /// (they are kept anyway when one fails).
    #[arg(long)]
    pub keep_logs: bool,
    /// Proof that the checks can fail: the stub records every call of this
    /// seller twice, as if the limiter had let twice the calls through.
    #[arg(long, hide = true)]
    pub fault_double_count: Vec<String>,
    /// Proof that the checks can fail: the stub answers this seller's calls
    /// but forgets them, as if its jobs were lost.
    #[arg(long, hide = true)]
    pub fault_forget: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (write e.g. 45s, 2m)"))
}

impl DemoArgs {
    fn validate(&self) -> anyhow::Result<()> {
        let d = self.duration;
        if d < Duration::from_secs(10) || d > Duration::from_secs(3600) {
            bail!(
                "--duration must be between 10s and 1h (the group takes seconds to form), got {}",
                humantime::format_duration(d)
            );
        }
        if !(1..=16).contains(&self.replicas) {
            bail!("--replicas must be between 1 and 16, got {}", self.replicas);
        }
        if !(1..=1000).contains(&self.sellers) {
            bail!("--sellers must be between 1 and 1000, got {}", self.sellers);
        }
        if !(self.rate.is_finite() && self.rate >= 1.0 && self.rate <= 5000.0) {
            bail!(
                "--rate must be between 1 and 5000 jobs/s, got {}",
                self.rate
            );
        }
        Ok(())
    }
}

/// Why the demo stopped before its summary.
#[derive(Debug, thiserror::Error)]
#[error("interrupted: the replicas were stopped; no summary")]
struct Interrupted;

/// Everything one demo run holds. Dropping it stops the replicas (see
/// [`Replicas`]), the stub and the broker.
struct Run {
    plan: Plan,
    args: DemoArgs,
    started: Instant,
    run_id: String,
    jobs_topic: String,
    stub: Stub,
    dlq: Option<DlqTail>,
    replicas: Replicas,
    metrics: Vec<(usize, String)>,
    sink: std::sync::Arc<RecordSink>,
    bar: ProgressBar,
    /// Configs and logs; dropped (removed) after the replicas stopped.
    scratch: tempfile::TempDir,
    /// Declared last: dropped after everything that talks to it.
    _broker: DevBroker,
}

/// The input of the demo's checks, gathered at the end.
struct Outcome {
    drained: Result<Duration, String>,
    stopped: Vec<(usize, Option<std::process::ExitStatus>)>,
    early_exits: Vec<String>,
    written: u64,
    load_time: Duration,
    dead: DeadLetters,
}

/// Runs the demo; `Ok` when every check holds, an error naming each check
/// that failed otherwise. Stops early, with an error, when `shutdown`
/// resolves (SIGTERM, Ctrl-C) or the user quits the live view.
pub async fn run(args: DemoArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    args.validate()?;
    // Redis first: the one thing the demo needs from outside.
    RedisStore::connect(&args.redis_url, Duration::from_secs(3))
        .await
        .map_err(|e| {
            anyhow!(
                "the demo needs a Redis at {} ({e}); start one, e.g. `scripts/with-redis.sh throttle-worker demo`, or set REDIS_URL",
                redact_url(&args.redis_url)
            )
        })?;
    let result = run_logged(args, shutdown).await;
    // Only now: the broker, the stub and the readers are gone, and their
    // last log lines went to the file too.
    crate::telemetry::redirect_logs(None);
    result
}

/// [`run`] once Redis answered; this process's logs go to `demo.log`.
async fn run_logged(args: DemoArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut run = Run::start(args).await?;
    let (stop_tx, mut stop_rx) = mpsc::unbounded_channel();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut view = View::open(stop_tx);
    let body = run.body(&mut view, &mut stop_rx, &mut shutdown).await;
    view.close();
    let outcome = match body {
        Ok(o) => o,
        Err(e) => {
            let stopped = run.replicas.stop(STOP_GRACE).await;
            let clean = stopped
                .iter()
                .filter(|(_, s)| s.is_some_and(|s| s.success()))
                .count();
            println!(
                "{} of {} replicas stopped cleanly; their logs and configs are kept in {}",
                clean,
                stopped.len(),
                run.keep_logs()
            );
            return Err(e);
        }
    };
    let (text, failures) = run.summary(&outcome);
    println!("{text}");
    if !failures.is_empty() || run.args.keep_logs {
        println!("replica logs and configs kept in {}", run.keep_logs());
    }
    if failures.is_empty() {
        return Ok(());
    }
    Err(anyhow!(
        "the demo's checks failed:\n  - {}",
        failures.join("\n  - ")
    ))
}

/// Waits `d`, or fails with [`Interrupted`] if the user stops the demo.
async fn pause(
    d: Duration,
    stop: &mut mpsc::UnboundedReceiver<()>,
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
) -> anyhow::Result<()> {
    tokio::select! {
        _ = tokio::time::sleep(d) => Ok(()),
        // A closed channel (the plain view has no keys) never stops.
        Some(()) = stop.recv() => Err(Interrupted.into()),
        _ = shutdown.as_mut() => Err(Interrupted.into()),
    }
}

impl Run {
    /// The broker, the stub, the config files, the dead-letter reader and
    /// the replicas, in that order.
    async fn start(args: DemoArgs) -> anyhow::Result<Run> {
        let started = Instant::now();
        let plan = Plan::new(
            args.rate,
            args.sellers,
            args.duration * 2 / 3,
            args.replicas,
        );
        let id = format!("{:08x}", rand::random::<u32>());
        let scratch = tempfile::Builder::new()
            .prefix(&format!("throttle-demo-{id}-"))
            .tempdir()
            .context("a scratch directory for the replicas' configs and logs")?;
        // The view owns the terminal: this process's own log lines (and
        // librdkafka's) go to a file beside the replicas' logs.
        let log = std::fs::File::create(scratch.path().join("demo.log"))
            .context("the demo's log file")?;
        crate::telemetry::redirect_logs(Some(log));

        // The demo's config keeps the default topic names: the broker is
        // its own, so they collide with nothing.
        let defaults = crate::config::load_from(None, Vec::new())?.settings.kafka;
        let topics = defaults.topic_specs(plan.partitions);
        let broker = DevBroker::start(&topics).context("the in-process Kafka broker")?;
        let stub = Stub::start(
            "127.0.0.1:0".parse().expect("a literal address"),
            StubConfig {
                throttle: plan.stub_throttles(),
                latency: Duration::ZERO,
                faults: Faults {
                    double_count: args.fault_double_count.iter().cloned().collect(),
                    forget: args.fault_forget.iter().cloned().collect(),
                },
            },
        )
        .await?;

        let mut configs = Vec::new();
        for number in 1..=args.replicas {
            let listen = free_port()?;
            let site = WorkerSite {
                brokers: broker.bootstrap_servers().to_owned(),
                group: format!("throttle-demo-{id}"),
                redis_url: args.redis_url.clone(),
                // A fresh prefix per run: no state of an earlier run.
                key_prefix: format!("demo-{id}"),
                downstream_url: stub.url(),
                listen,
            };
            let path = scratch.path().join(format!("replica-{number}.toml"));
            std::fs::write(&path, plan.worker_toml(&site))
                .with_context(|| format!("writing {}", path.display()))?;
            configs.push((path, listen));
        }
        // The replicas would refuse a bad config one by one; say it once.
        let loaded = crate::config::load_from(Some(&configs[0].0), Vec::new())
            .context("the demo's worker config")?;
        Policy::load(&loaded).context("the demo's worker config")?;
        let kafka = &loaded.settings.kafka;
        if kafka.topic_specs(plan.partitions) != topics {
            bail!("the demo's worker config names other topics than the broker has: {topics:?}");
        }
        let dlq = DlqTail::start(
            broker.bootstrap_servers(),
            &kafka.properties,
            &kafka.dlq_topic,
        )
        .context("reading the dead-letter topic")?;
        let sink = RecordSink::new(broker.bootstrap_servers(), &kafka.producer_config())
            .context("the load's Kafka producer")?;

        let exe = std::env::current_exe().context("the path of this binary")?;
        let launches: Vec<Launch> = configs
            .iter()
            .map(|(config, listen)| Launch {
                config,
                listen: *listen,
            })
            .collect();
        let replicas = Replicas::spawn(&exe, &launches, scratch.path())
            .with_context(|| format!("starting {} run --config ...", exe.display()))?;
        let metrics = replicas
            .list
            .iter()
            .map(|r| (r.number, format!("{}/metrics", r.base_url)))
            .collect();
        Ok(Run {
            jobs_topic: kafka.topic.clone(),
            plan,
            args,
            started,
            scratch,
            run_id: format!("demo-{id}"),
            stub,
            dlq: Some(dlq),
            replicas,
            metrics,
            sink: std::sync::Arc::new(sink),
            bar: ProgressBar::hidden(),
            _broker: broker,
        })
    }

    /// Keeps the scratch directory and returns its path.
    fn keep_logs(&mut self) -> String {
        let dir = std::mem::replace(
            &mut self.scratch,
            tempfile::TempDir::new().expect("a temporary directory"),
        );
        dir.keep().display().to_string()
    }

    fn logs(&self) -> String {
        self.scratch.path().display().to_string()
    }

    /// Startup, load and live view, drain, stop: what the checks need.
    async fn body(
        &mut self,
        view: &mut View,
        stop: &mut mpsc::UnboundedReceiver<()>,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> anyhow::Result<Outcome> {
        self.wait_ready(view, stop, shutdown).await?;

        let load_started = Instant::now();
        let spec = LoadSpec {
            jobs: self.plan.jobs,
            sellers: self.plan.sellers.len() as u64,
            skew: plan::SKEW,
            rate: self.plan.rate,
            malformed: plan::MALFORMED,
            payload_bytes: 64,
            run_id: self.run_id.clone(),
        };
        let (sink, topic, bar) = (self.sink.clone(), self.jobs_topic.clone(), self.bar.clone());
        let mut load =
            tokio::spawn(async move { load::run_with_progress(&sink, &topic, &spec, bar).await });
        let mut early_exits = Vec::new();
        let mut written = None;
        while load_started.elapsed() < self.args.duration {
            let phase = format!(
                "{} {:.0} s of {:.0} s",
                if load.is_finished() { "live" } else { "load" },
                load_started.elapsed().as_secs_f64(),
                self.args.duration.as_secs_f64()
            );
            let (snap, _) = self.snapshot(&phase).await;
            view.show(&snap);
            for (n, status) in self.replicas.exited() {
                let note = format!("replica {n} exited early ({status})");
                if !early_exits.contains(&note) {
                    early_exits.push(note);
                }
            }
            if written.is_none() && load.is_finished() {
                written = Some((&mut load).await??);
            }
            pause(Duration::from_secs(1), stop, shutdown).await?;
        }
        let written = match written {
            Some(w) => w,
            None => {
                // The load runs for two thirds of the duration; a broker
                // slower than the pace is the only way to be here.
                view.show(&self.snapshot("load (behind its pace)").await.0);
                load.await??
            }
        };
        let load_time = self.plan.load_time;

        let drained = self.drain(view, stop, shutdown).await?;
        view.show(&self.snapshot("stopping").await.0);
        let stopped = self.replicas.stop(STOP_GRACE).await;
        let dead = self
            .dlq
            .take()
            .expect("the dead-letter reader runs until here")
            .finish(Duration::from_secs(20))
            .await
            .context("reading the dead-letter topic to its end")?;
        Ok(Outcome {
            drained,
            stopped,
            early_exits,
            written,
            load_time,
            dead,
        })
    }

    /// Until every replica answers `/readyz` (in the group, Redis up).
    async fn wait_ready(
        &mut self,
        view: &mut View,
        stop: &mut mpsc::UnboundedReceiver<()>,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = usize::MAX;
        loop {
            if let Some((n, status)) = self.replicas.exited().first().copied() {
                let r = &self.replicas.list[n - 1];
                bail!(
                    "replica {n} exited at startup ({status}); the end of {}:\n{}",
                    r.log.display(),
                    r.log_tail(15)
                );
            }
            let ready = futures::future::join_all(self.replicas.list.iter().map(|r| async move {
                let url = format!("{}/readyz", r.base_url);
                crate::downstream::get_text(&url, Duration::from_millis(500)).await
            }))
            .await
            .iter()
            .filter(|r| r.is_ok())
            .count();
            if ready == self.replicas.list.len() {
                return Ok(());
            }
            if ready != last {
                let snap = Snapshot {
                    phase: format!(
                        "starting: {ready} of {} replicas in the group",
                        self.replicas.list.len()
                    ),
                    to_produce: self.plan.jobs,
                    replicas: self.replicas.list.len(),
                    replicas_up: ready,
                    logs: self.logs(),
                    ..Default::default()
                };
                match view {
                    View::Plain { .. } => println!("{}", snap.phase),
                    View::Tui(_) => view.show(&snap),
                }
                last = ready;
            }
            if Instant::now() > deadline {
                bail!(
                    "only {ready} of {} replicas were ready (in the group, Redis answering) after {READY_TIMEOUT:?}; see replica-*.log",
                    self.replicas.list.len()
                );
            }
            pause(Duration::from_millis(250), stop, shutdown).await?;
        }
    }

    /// Until the pipeline holds nothing (no lag, nothing waiting, parked or
    /// in flight) in two scrapes a second apart, or [`DRAIN_TIMEOUT`].
    /// `Ok(Err(state))` when it did not drain in time.
    async fn drain(
        &mut self,
        view: &mut View,
        stop: &mut mpsc::UnboundedReceiver<()>,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> anyhow::Result<Result<Duration, String>> {
        let began = Instant::now();
        let mut idle_once = false;
        loop {
            let waited = began.elapsed();
            let phase = format!(
                "draining ({:.0} of {:.0} s)",
                waited.as_secs_f64(),
                DRAIN_TIMEOUT.as_secs_f64()
            );
            let (snap, fleet) = self.snapshot(&phase).await;
            let idle = fleet.idle(self.replicas.list.len());
            if idle && idle_once {
                return Ok(Ok(waited));
            }
            idle_once = idle;
            if waited > DRAIN_TIMEOUT {
                return Ok(Err(format!(
                    "lag {:.0} (jobs topic) + {:.0} (retry tiers), waiting {:.0}, parked {:.0}, in flight {:.0}, replicas answering {} of {}",
                    fleet.lag_of(&self.jobs_topic),
                    fleet.lag_except(&self.jobs_topic),
                    fleet.waiting_total(),
                    fleet.parked,
                    fleet.in_flight,
                    fleet.up,
                    self.replicas.list.len()
                )));
            }
            if let View::Plain { .. } = view {
                // One line a second while draining, not the whole table.
                println!("{phase}: {}", snap_line(&snap));
            } else {
                view.show(&snap);
            }
            pause(Duration::from_secs(1), stop, shutdown).await?;
        }
    }

    async fn snapshot(&self, phase: &str) -> (Snapshot, Fleet) {
        let fleet = scrape::scrape(&self.metrics, Duration::from_millis(800)).await;
        let counts = self.stub.counts();
        let recent = self.stub.recent_calls(Duration::from_secs(2));
        let dead = self.dlq.as_ref().map(DlqTail::counts).unwrap_or_default();
        let rows = self
            .plan
            .sellers
            .iter()
            .map(|s| {
                let (calls, _, throttled) = counts.get(&s.id).copied().unwrap_or_default();
                let (waiting_limit, waiting_capacity) =
                    fleet.waiting.get(&s.id).copied().unwrap_or_default();
                SellerRow {
                    seller: s.id.clone(),
                    role: s.role.label(),
                    rule: plan::describe(&s.rule),
                    limit_per_sec: s.limit_per_sec(),
                    rate_per_sec: recent.get(&s.id).copied().unwrap_or(0) as f64 / 2.0,
                    calls,
                    throttled_429: throttled,
                    waiting_limit,
                    waiting_capacity,
                    dead: dead.by_seller.get(&s.id).copied().unwrap_or(0),
                }
            })
            .collect();
        let mut dead_reasons: Vec<(String, usize)> = dead.by_reason.into_iter().collect();
        dead_reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
        dead_reasons.truncate(5);
        let notes = fleet
            .down
            .iter()
            .map(|(n, why)| format!("replica {n} did not answer: {why}"))
            .collect();
        let snap = Snapshot {
            phase: phase.to_owned(),
            produced: self.bar.position(),
            to_produce: self.plan.jobs,
            replicas: self.replicas.list.len(),
            replicas_up: fleet.up,
            rows,
            parked: fleet.parked,
            to_retry: fleet.to_retry,
            in_flight: fleet.in_flight,
            lag_jobs: fleet.lag_of(&self.jobs_topic),
            lag_retry: fleet.lag_except(&self.jobs_topic),
            lag_seconds: fleet.lag_seconds.values().copied().fold(0.0, f64::max),
            dead_total: dead.total,
            dead_reasons,
            notes,
            logs: self.logs(),
        };
        (snap, fleet)
    }

    /// The summary text and the failed checks (empty: all held).
    fn summary(&self, o: &Outcome) -> (String, Vec<String>) {
        let stats = self.stub.stats();
        let mut failures = Vec::new();
        let mut out = String::new();
        let line = |out: &mut String, s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(
            &mut out,
            format!(
                "\nthrottle-worker demo: {} replicas, {} sellers, {} jobs at {:.0}/s over {:.0} s ({:.0}% malformed); {:.0} s in all",
                self.replicas.list.len(),
                self.plan.sellers.len(),
                o.written,
                self.plan.rate,
                o.load_time.as_secs_f64(),
                plan::MALFORMED * 100.0,
                self.started.elapsed().as_secs_f64()
            ),
        );

        // 1. Limits, from every call's arrival at the stub.
        line(
            &mut out,
            format!(
                "\nLimits (busiest stretch of each seller's calls at the stub, 429'd calls included; {} ms allowed from grant to arrival):",
                check::SLACK.as_millis()
            ),
        );
        let mut verdicts = Vec::new();
        let mut rules = BTreeMap::new();
        let mut table = vec![[
            "seller".to_owned(),
            "role".to_owned(),
            "rule".to_owned(),
            "calls".to_owned(),
            "429s".to_owned(),
            "busiest".to_owned(),
            "allowed".to_owned(),
            String::new(),
        ]];
        for s in &self.plan.sellers {
            let seen = stats.sellers.get(&s.id).cloned().unwrap_or_default();
            let result = check::busiest(&s.rule, &seen.arrivals_us);
            let rule = plan::describe(&s.rule)
                + &s.stub_throttle
                    .as_ref()
                    .map(|t| {
                        format!(
                            " (stub: {}/{})",
                            t.limit,
                            humantime::format_duration(t.period)
                        )
                    })
                    .unwrap_or_default();
            let (busiest, allowed, verdict) = match &result {
                Ok(b) => (
                    b.describe(),
                    b.allowed.to_string(),
                    if b.held() { "within" } else { "OVER" },
                ),
                Err(e) => (e.to_string(), String::new(), "UNCHECKED"),
            };
            table.push([
                s.id.clone(),
                s.role.label().to_owned(),
                rule,
                seen.calls.to_string(),
                seen.throttled.to_string(),
                busiest,
                allowed,
                verdict.to_owned(),
            ]);
            rules.insert(s.id.clone(), plan::describe(&s.rule));
            verdicts.push(SellerVerdict {
                seller: s.id.clone(),
                result,
            });
        }
        out.push_str(&columns(&table, &[3, 4, 6]));
        let over = check::limit_failures(&verdicts, &rules);
        let held = verdicts.len() - over.len();
        line(
            &mut out,
            format!("{held} of {} sellers within their limits", verdicts.len()),
        );
        failures.extend(over);

        // 2. Nothing lost: every produced id reached the stub or the DLQ.
        let jobs = self.stub.jobs();
        let ids = (0..o.written).map(|i| load::job_id(&self.run_id, i));
        let a: Accounting = check::account(ids, &jobs, &o.dead.job_ids);
        line(
            &mut out,
            format!(
                "\nNothing lost: {} produced = {} done (accepted by the stub) + {} dead-lettered + {} missing; {} done more than once (at-least-once)",
                a.produced, a.done, a.dead, a.missing_count, a.repeated
            ),
        );
        if a.missing_count > 0 {
            failures.push(format!(
                "{} of {} jobs are missing (neither accepted by the stub nor dead-lettered), e.g. {}",
                a.missing_count,
                a.produced,
                a.missing.join(", ")
            ));
        }
        line(
            &mut out,
            format!("Dead letters by reason ({}):", o.dead.total),
        );
        let mut reasons: Vec<_> = o.dead.by_reason.iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(*r.1));
        for (reason, n) in reasons {
            line(&mut out, format!("  {n:>6}  {reason}"));
        }

        // 3. Drained, and the replicas ran to the end.
        match &o.drained {
            Ok(took) => line(
                &mut out,
                format!(
                    "\nDrained {:.1} s after the live phase: no lag, nothing waiting, parked or in flight",
                    took.as_secs_f64()
                ),
            ),
            Err(state) => failures.push(format!(
                "the pipeline did not drain within {DRAIN_TIMEOUT:?} after the live phase: {state}"
            )),
        }
        failures.extend(o.early_exits.iter().cloned());
        for (n, status) in &o.stopped {
            match status {
                Some(s) if s.success() => {}
                Some(s) => failures.push(format!(
                    "replica {n} exited with {s} on SIGTERM (see replica-{n}.log)"
                )),
                None => failures.push(format!(
                    "replica {n} did not stop within {STOP_GRACE:?} of SIGTERM and was killed"
                )),
            }
        }
        if failures.is_empty() {
            line(
                &mut out,
                "\nAll checks hold: every seller within its limit, nothing lost, drained, replicas stopped cleanly.".to_owned(),
            );
        } else {
            line(&mut out, format!("\n{} check(s) FAILED:", failures.len()));
            for f in &failures {
                line(&mut out, format!("  - {f}"));
            }
        }
        (out, failures)
    }
}

/// The counts of a snapshot on one line (the plain drain progress).
fn snap_line(s: &Snapshot) -> String {
    let waiting: f64 = s
        .rows
        .iter()
        .map(|r| r.waiting_limit + r.waiting_capacity)
        .sum();
    format!(
        "lag {:.0} + {:.0} (retry tiers), waiting {waiting:.0}, parked {:.0}, in flight {:.0}, dead-lettered {}",
        s.lag_jobs, s.lag_retry, s.parked, s.in_flight, s.dead_total
    )
}

/// Rows as aligned columns; `right` are the right-aligned ones.
fn columns<const N: usize>(rows: &[[String; N]], right: &[usize]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if right.contains(&i) {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A loopback port free now, for a replica's `http.listen`.
fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("a free loopback port")?;
    Ok(l.local_addr()?)
}
