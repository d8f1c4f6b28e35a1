//! One demo run: the broker, the stub, the replicas and the dead-letter
//! reader started in that order; the load and the live view; the drain;
//! the replicas stopped; what the checks need gathered in an [`Outcome`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use tokio::sync::mpsc;

use crate::dev::load::{self, LoadSpec};
use crate::dev::stub::{Faults, Stub, StubConfig};
use crate::kafka::{DevBroker, RecordSink};
use crate::limiter::Policy;

use super::dlq::{DeadLetters, DlqTail};
use super::plan::{self, Plan, WorkerSite};
use super::replicas::{Launch, Replicas};
use super::scrape::{self, Fleet};
use super::view::{SellerRow, Snapshot, View};
use super::{DemoArgs, DemoError};

/// How long the replicas may take to join the group and be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the pipeline may take to drain after the live phase: one full
/// window of the stub's throttle and a little more.
pub(super) const DRAIN_TIMEOUT: Duration =
    plan::STUB_WINDOW_MAX.saturating_add(Duration::from_secs(5));

/// SIGTERM to exit: a worker's `shutdown_timeout` (5 s in the demo) and
/// closing its Kafka clients.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(12);

/// Everything one demo run holds. Dropping it stops the replicas (see
/// [`Replicas`]), the stub and the broker.
pub(super) struct Run {
    pub(super) plan: Plan,
    pub(super) args: DemoArgs,
    pub(super) started: Instant,
    pub(super) run_id: String,
    jobs_topic: String,
    pub(super) stub: Stub,
    dlq: Option<DlqTail>,
    pub(super) replicas: Replicas,
    metrics: Vec<(usize, String)>,
    sink: std::sync::Arc<RecordSink>,
    bar: ProgressBar,
    /// Configs and logs; dropped (removed) after the replicas stopped.
    scratch: tempfile::TempDir,
    /// Declared last: dropped after everything that talks to it.
    _broker: DevBroker,
}

/// The input of the demo's checks, gathered at the end.
pub(super) struct Outcome {
    pub(super) drained: Result<Duration, String>,
    pub(super) stopped: Vec<(usize, Option<std::process::ExitStatus>)>,
    pub(super) early_exits: Vec<String>,
    pub(super) written: u64,
    pub(super) load_time: Duration,
    pub(super) dead: DeadLetters,
}

/// Waits `d`, or fails with [`DemoError::Interrupted`] if the user stops
/// the demo.
async fn pause(
    d: Duration,
    stop: &mut mpsc::UnboundedReceiver<()>,
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
) -> Result<(), DemoError> {
    tokio::select! {
        _ = tokio::time::sleep(d) => Ok(()),
        // A closed channel (the plain view has no keys) never stops.
        Some(()) = stop.recv() => Err(DemoError::Interrupted),
        _ = shutdown.as_mut() => Err(DemoError::Interrupted),
    }
}

impl Run {
    /// The broker, the stub, the config files, the dead-letter reader and
    /// the replicas, in that order.
    pub(super) async fn start(args: DemoArgs) -> Result<Run, DemoError> {
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
            .map_err(DemoError::Scratch)?;
        // The view owns the terminal: this process's own log lines (and
        // librdkafka's) go to a file beside the replicas' logs.
        let log =
            std::fs::File::create(scratch.path().join("demo.log")).map_err(DemoError::LogFile)?;
        crate::telemetry::redirect_logs(Some(log));

        // The demo's config keeps the default topic names: the broker is
        // its own, so they collide with nothing.
        let defaults = crate::config::load_from(None, Vec::new())
            .map_err(DemoError::Defaults)?
            .settings
            .kafka;
        let topics = defaults.topic_specs(plan.partitions);
        let broker = DevBroker::start(&topics).map_err(DemoError::Broker)?;
        let stub = Stub::start(
            "127.0.0.1:0".parse().expect("a literal address"),
            StubConfig {
                throttle: plan.stub_throttles(),
                latency: Duration::ZERO,
                faults: Faults {
                    double_count: args.fault_double_count.iter().cloned().collect(),
                    forget: args.fault_forget.iter().cloned().collect(),
                },
                fail: Default::default(),
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
            std::fs::write(&path, plan.worker_toml(&site)).map_err(|source| {
                DemoError::WriteConfig {
                    path: path.clone(),
                    source,
                }
            })?;
            configs.push((path, listen));
        }
        // The replicas would refuse a bad config one by one; say it once.
        let loaded = crate::config::load_from(Some(&configs[0].0), Vec::new())
            .map_err(DemoError::WorkerConfig)?;
        Policy::load(&loaded).map_err(DemoError::WorkerConfig)?;
        let kafka = &loaded.settings.kafka;
        if kafka.topic_specs(plan.partitions) != topics {
            return Err(DemoError::OtherTopics(topics));
        }
        let dlq = DlqTail::start(
            broker.bootstrap_servers(),
            &kafka.properties,
            &kafka.dlq_topic,
        )
        .map_err(DemoError::DlqStart)?;
        let sink = RecordSink::new(broker.bootstrap_servers(), &kafka.producer_config())
            .map_err(DemoError::Producer)?;

        let exe = std::env::current_exe().map_err(DemoError::CurrentExe)?;
        let launches: Vec<Launch> = configs
            .iter()
            .map(|(config, listen)| Launch {
                config,
                listen: *listen,
            })
            .collect();
        let replicas = Replicas::spawn(&exe, &launches, scratch.path())
            .map_err(|source| DemoError::Spawn { exe, source })?;
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
    pub(super) fn keep_logs(&mut self) -> String {
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
    pub(super) async fn body(
        &mut self,
        view: &mut View,
        stop: &mut mpsc::UnboundedReceiver<()>,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Outcome, DemoError> {
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
                written = Some((&mut load).await?.map_err(DemoError::Load)?);
            }
            pause(Duration::from_secs(1), stop, shutdown).await?;
        }
        let written = match written {
            Some(w) => w,
            None => {
                // The load runs for two thirds of the duration; a broker
                // slower than the pace is the only way to be here.
                view.show(&self.snapshot("load (behind its pace)").await.0);
                load.await?.map_err(DemoError::Load)?
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
            .map_err(DemoError::DlqFinish)?;
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
    ) -> Result<(), DemoError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = usize::MAX;
        loop {
            if let Some((n, status)) = self.replicas.exited().first().copied() {
                let r = &self.replicas.list[n - 1];
                return Err(DemoError::ReplicaExited {
                    n,
                    status,
                    log: r.log.clone(),
                    tail: r.log_tail(15),
                });
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
                return Err(DemoError::NotReady {
                    ready,
                    replicas: self.replicas.list.len(),
                    after: READY_TIMEOUT,
                });
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
    ) -> Result<Result<Duration, String>, DemoError> {
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

/// A loopback port free now, for a replica's `http.listen`.
fn free_port() -> Result<SocketAddr, DemoError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(DemoError::FreePort)?;
    l.local_addr().map_err(DemoError::PortAddr)
}
