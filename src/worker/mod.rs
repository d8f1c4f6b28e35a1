//! The worker: Kafka consumer group → per-seller permit → downstream API.
//!
//! - [`engine`]: the event loop, dispatch and the drain at shutdown; the
//!   engine's concerns each have a file of their own: `sellers` (queues,
//!   slots, capacity turns), `admit` (limiter answers, failure policy),
//!   `run` (downstream runs, pacing, 429 holds), `retry` (parking,
//!   deferral, retry/DLQ writes), `partitions` (rebalances, `unstick`,
//!   backpressure, gauges), `outage` (a downstream outage told apart
//!   from a job's own failure), `paused` (an operator's pause: held
//!   sellers, parked jobs), `timers` (timer heap, time arithmetic).
//! - [`ports`]: the traits through which the engine reaches its world
//!   (clock, consumer, writer, downstream; the limiter is [`Permits`]),
//!   and the production implementations ([`ports::Live`]).
//! - [`memory`]: jobs and bytes held, and when fetching pauses.
//! - [`slots`]: slots of a seller's `max_in_flight` across the fleet, held
//!   by granted jobs as leases that go back when dropped.
//! - [`permit`]: the limiter as the worker sees it, and the one place where
//!   a limiter failure becomes a decision.
//! - [`reload`]: the config file watched, its `[limits]` applied live.
//! - [`ledger`]: the consumers' handoff ledger in Redis (what each commit
//!   says is finished, where a rebalance cannot refuse it).
//!
//! [`run`] checks every dependency at startup, then runs the engine until
//! the shutdown future resolves.

mod admit;
pub mod engine;
pub mod ledger;
pub mod memory;
mod outage;
mod partitions;
mod paused;
pub mod permit;
pub mod ports;
pub mod reload;
mod retry;
mod run;
mod sellers;
pub mod slots;
mod timers;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::Settings;
use crate::downstream::Downstream;
use crate::kafka::{Consumers, RecordSink};
use crate::limiter::{CoalesceSettings, Coalescer, KeySpace, Limiter, Policy, RedisStore};
use crate::telemetry::events::{PausesRead, SharedState, SharedStateUnreadable};
use crate::telemetry::http;
use crate::telemetry::trace::Export;

pub use engine::{Deps, Engine, Pending, Summary};
pub use permit::{OnLimiterError, PermitError, Permits, SellerInfo};
pub use ports::{Caller, Clock, CommitError, Live, Ports, Source, SystemClock, WriteError, Writer};

/// Why a worker did not start: the settings to look at, with the cause as
/// its source (`{:#}` prints both, as `main` does).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("downstream.url / downstream settings")]
    Downstream(#[source] crate::downstream::DownstreamError),
    #[error("redis.url: Redis must answer PING and accept the limiter scripts")]
    Redis(#[source] crate::limiter::RedisError),
    #[error("redis.state")]
    Layout(#[source] crate::limiter::layout::LayoutError),
    #[error("kafka settings")]
    Kafka(#[source] crate::kafka::consumer::ConsumerError),
    #[error("kafka.brokers / topics")]
    Topics(#[source] crate::kafka::consumer::ConsumerError),
    #[error("kafka producer")]
    Producer(#[source] crate::kafka::SinkError),
    #[error("kafka subscribe")]
    Subscribe(#[source] crate::kafka::consumer::ConsumerError),
    #[error("kafka consumer")]
    Consumer(#[source] crate::kafka::consumer::ConsumerError),
    #[error("http.listen")]
    Listen(#[source] std::io::Error),
    #[error(transparent)]
    Reload(#[from] reload::ReloadError),
    #[error("tracing.otlp_endpoint")]
    Traces(#[source] crate::telemetry::trace::TraceError),
}

/// How long startup waits for Kafka metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// How long closing the Kafka clients may take at shutdown.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// `/healthz` fails when the event loop has not turned for this long (or
/// five commit intervals, if longer).
const STUCK_AFTER_MIN: Duration = Duration::from_secs(10);

/// Runs one worker until `shutdown` resolves. Fails at startup, with what to
/// fix, when Redis, Kafka or the downstream URL is not usable.
pub async fn run(
    settings: Settings,
    policy: Policy,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, StartError> {
    run_watching(settings, policy, None, shutdown).await
}

/// [`run`], and with `config_file` the file's `[limits]` are applied again
/// whenever it changes or the process gets SIGHUP (see [`reload`]).
pub async fn run_watching(
    settings: Settings,
    policy: Policy,
    config_file: Option<PathBuf>,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, StartError> {
    let settings = Arc::new(settings);
    crate::telemetry::events::WorkerConfigured {
        max_buffered_bytes: settings.worker.max_buffered_bytes,
    }
    .emit();
    let worker_id = worker_id(&settings.kafka.group_instance_id);
    let downstream = Downstream::new(
        &settings.downstream.url,
        settings.downstream.timeout,
        settings.downstream.concurrency,
    )
    .map_err(StartError::Downstream)?
    .with_max_retry_after(settings.downstream.max_retry_after)
    .with_retry_statuses(settings.downstream.retry_statuses.clone())
    .with_worker_id(&worker_id);
    let store = RedisStore::open(&settings.redis)
        .await
        .map_err(StartError::Redis)?;
    // Sellers the config names get series of their own; all others are
    // counted together, so /metrics stays small with any number of sellers.
    crate::telemetry::metrics::name_sellers(policy.named_sellers().map(str::to_owned));
    let prefix = &settings.redis.key_prefix;
    let layout = crate::limiter::layout::resolve(&store, prefix, settings.redis.state, true)
        .await
        .map_err(StartError::Layout)?;
    let ledger = ledger::RedisLedger::new(store.clone(), prefix, &settings.kafka.group_id);
    let limiter = Limiter::new(
        store,
        KeySpace::with_layout(prefix.clone(), layout),
        policy,
        settings.redis.topology,
    )
    .with_state_loss(settings.redis.on_state_loss);
    let (part_tx, part_rx) = mpsc::unbounded_channel();
    let consumer = Consumers::new(&settings.kafka, part_tx, Some(Arc::new(ledger)))
        .map_err(StartError::Kafka)?;
    let k = &settings.kafka;
    let all = k.all_topics();
    let topics: Vec<&str> = all.iter().map(String::as_str).collect();
    let check = tokio::task::block_in_place(|| consumer.check_topics(&topics, METADATA_TIMEOUT));
    let counts = check.map_err(StartError::Topics)?;
    debug_assert_eq!(
        topics[0], k.topic,
        "all_topics() starts with the jobs topic"
    );
    let sink =
        RecordSink::new(&k.brokers, &settings.producer_config()).map_err(StartError::Producer)?;
    // The jobs topic to one consumer, every retry tier (all but the jobs
    // and the dead-letter topic) to the other.
    consumer
        .subscribe(&topics[1..topics.len() - 1])
        .map_err(StartError::Subscribe)?;
    let records = consumer.start().map_err(StartError::Consumer)?;
    // The event loop turns at least every commit interval.
    let health = http::Health::new((settings.kafka.commit_interval * 5).max(STUCK_AFTER_MIN));
    let server = http::serve(settings.http.listen, health.clone())
        .await
        .map_err(StartError::Listen)?;
    tracing::info!(
        group = %k.group_id,
        worker_id = %worker_id,
        topic = %k.topic,
        retry_topic = %k.retry_topic,
        dlq_topic = %k.dlq_topic,
        http = %server,
        "worker started"
    );
    let limiter = Arc::new(limiter);
    let watching = if config_file.is_some() || settings.limits.file.is_some() {
        Some(reload::spawn(
            config_file,
            limiter.clone(),
            (*settings).clone(),
        )?)
    } else {
        // SIGHUP's default action ends the process: with nothing to reload
        // it must still be caught, or a `kill -HUP` meant as "reload" (the
        // README's advice) kills a worker that watches no file.
        #[cfg(unix)]
        reload::ignore_hangup().map_err(reload::ReloadError::Signal)?;
        None
    };
    // Temporary overrides set with `limits override` live in Redis: read
    // them now and every second, so every replica applies them together.
    if let Err(e) = limiter.refresh_overrides().await {
        SharedStateUnreadable {
            what: SharedState::Overrides,
            error: &e.to_string(),
        }
        .emit();
    }
    let overrides = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::limiter::overrides::REFRESH).await;
                if let Err(e) = limiter.refresh_overrides().await {
                    SharedStateUnreadable {
                        what: SharedState::Overrides,
                        error: &e.to_string(),
                    }
                    .emit();
                }
            }
        })
    };
    // Operators' pauses (`limits pause`) live in Redis too: read them now
    // and four times a second, so a pause stops every replica's calls
    // within a second.
    let pauses = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                match limiter.refresh_pauses().await {
                    Ok(p) => {
                        PausesRead {
                            sellers: p.sellers.len(),
                            all: p.all.is_some(),
                            changed: last.as_ref().is_some_and(|l| *l != p)
                                || (last.is_none() && !p.is_empty()),
                        }
                        .emit();
                        last = Some(p);
                    }
                    Err(e) => SharedStateUnreadable {
                        what: SharedState::Pauses,
                        error: &e.to_string(),
                    }
                    .emit(),
                }
                tokio::time::sleep(crate::limiter::pauses::REFRESH).await;
            }
        })
    };
    health.set_ready(true);
    let consumer = Arc::new(consumer);
    let sink = Arc::new(sink);
    let permits = Coalescer::start(
        limiter.clone(),
        CoalesceSettings {
            max: settings.redis.coalesce_max,
            window: settings.redis.coalesce_window,
            ..CoalesceSettings::default()
        },
    );
    // Job spans, once every startup check has passed: an export is not
    // left behind by a failed start.
    let t = &settings.tracing;
    let traces = Export::start(
        &t.otlp_endpoint,
        t.sample_ratio,
        &t.service_name,
        &worker_id,
    )
    .map_err(StartError::Traces)?;
    if traces.is_some() {
        tracing::info!(
            endpoint = %crate::config::redact_url(&t.otlp_endpoint),
            sample_ratio = t.sample_ratio,
            "exporting job spans through OTLP"
        );
    }
    let deps: Deps<Live> = Deps {
        permits: Arc::new(permits),
        caller: Arc::new(downstream),
        writer: sink.clone(),
        source: consumer.clone(),
        clock: Arc::new(SystemClock),
        records,
        partitions: part_rx,
        health: health.clone(),
        jobs_partitions: counts[0],
        seed: rand::random(),
    };
    let summary = Engine::new(settings.clone(), deps).run(shutdown).await;
    if let Some(w) = watching {
        w.abort();
    }
    overrides.abort();
    pauses.abort();
    // Closing a librdkafka client blocks (leaving the group, flushing); do it
    // off the async threads, and do not let a broker that stopped answering
    // hold the process forever.
    let close = tokio::task::spawn_blocking(move || {
        consumer.shutdown();
        drop(consumer);
        drop(sink);
    });
    if tokio::time::timeout(CLOSE_TIMEOUT, close).await.is_err() {
        tracing::warn!(timeout = ?CLOSE_TIMEOUT, "Kafka clients did not close in time; exiting anyway");
    }
    if let Some(traces) = traces {
        // The last spans are exported (within a few seconds); blocking.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    health.set_ready(false);
    tracing::info!(?summary, "worker stopped");
    Ok(summary)
}

/// This replica's name in logs and in `X-Worker-Id`: its static group
/// member id when it has one, else host, process and a random suffix (two
/// workers in one process, as in the tests, differ too).
fn worker_id(group_instance_id: &str) -> String {
    let id = group_instance_id.trim();
    if !id.is_empty() {
        return id.to_owned();
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}
