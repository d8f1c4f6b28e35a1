//! A worker's start and stop: every dependency checked at startup (with
//! what to fix when one is not usable), the engine run until the shutdown
//! future resolves, and the clients closed after.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::downstream::Downstream;
use crate::kafka::consumer::{PartitionEvent, Record};
use crate::kafka::{Consumers, RecordSink};
use crate::limiter::{CoalesceSettings, Coalescer, KeySpace, Limiter, Policy, RedisStore};
use crate::telemetry::events::WorkerConfigured;
use crate::telemetry::http;
use crate::telemetry::trace::Export;

use super::engine::{Deps, Engine, Summary};
use super::ledger::RedisLedger;
use super::ordering::Ordering;
use super::ports::{Live, SystemClock};
use super::{refresh, reload};

/// Why a worker did not start: the settings to look at, with the cause as
/// its source (`{:#}` prints both, as `main` does).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("downstream.url / downstream settings")]
    Downstream(#[source] crate::downstream::DownstreamError),
    #[error("redis.url: Redis must answer PING and accept the limiter scripts")]
    Redis(#[source] crate::limiter::RedisError),
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
    WorkerConfigured {
        max_buffered_bytes: settings.worker.max_buffered_bytes,
    }
    .emit();
    let worker_id = worker_id(&settings.kafka.group_instance_id);
    let downstream = downstream(&settings, &worker_id)?;
    let (limiter, ledger) = limiter(&settings, policy, &worker_id).await?;
    let kafka = Kafka::start(&settings, ledger)?;
    // The event loop turns at least every commit interval.
    let health = http::Health::new((settings.kafka.commit_interval * 5).max(STUCK_AFTER_MIN));
    let server = http::serve(settings.http.listen, health.clone())
        .await
        .map_err(StartError::Listen)?;
    let k = &settings.kafka;
    tracing::info!(
        group = %k.group_id,
        worker_id = %worker_id,
        topic = %k.topic,
        retry_topic = %k.retry_topic_prefix,
        dlq_topic = %k.dlq_topic,
        http = %server,
        "worker started"
    );
    let limiter = Arc::new(limiter);
    new_install(&kafka, &limiter);
    let watching = watch(config_file, &limiter, &settings)?;
    // Overrides and pauses live in Redis: read now, then on a timer.
    let overrides = refresh::overrides(limiter.clone()).await;
    let pauses = refresh::pauses(limiter.clone());
    let waits = refresh::waits(limiter.clone(), worker_id.clone());
    let epoch = refresh::epoch(limiter.clone());
    health.set_ready(true);
    let permits = Coalescer::start(
        limiter.clone(),
        CoalesceSettings {
            max: settings.redis.max_coalesced,
            window: settings.redis.coalesce_window,
            ..CoalesceSettings::default()
        },
    );
    // Job spans, once every startup check has passed: an export is not
    // left behind by a failed start.
    let traces = traces(&settings, &worker_id)?;
    let deps: Deps<Live> = Deps {
        permits: Arc::new(permits),
        caller: Arc::new(downstream),
        writer: kafka.sink.clone(),
        source: kafka.consumer.clone(),
        clock: Arc::new(SystemClock),
        records: kafka.records,
        partitions: kafka.partitions,
        health: health.clone(),
        jobs_partitions: kafka.jobs_partitions,
        seed: rand::random(),
    };
    let summary = Engine::new(settings.clone(), deps).run(shutdown).await;
    for task in watching
        .into_iter()
        .chain([overrides, pauses, waits])
        .chain(epoch)
    {
        task.abort();
    }
    close(kafka.consumer, kafka.sink, traces).await;
    health.set_ready(false);
    tracing::info!(?summary, "worker stopped");
    Ok(summary)
}

/// Tells the limiter whether this install is new (its consumer group had
/// never committed when this replica started), and how its first charging
/// call makes sure: read at the start, "never committed" may be stale by
/// then (another replica may have called since, and Redis lost that), so
/// the call reads the group's commits again and commits this replica's
/// start positions before it goes (`Limiter::set_install_check`), the
/// epoch written first (`Limiter::begin_install`). A group that committed
/// since, a read, a write or a commit that failed (a rebalance), or no
/// record to commit: not new, and a missing state is a loss (held
/// `redis.state_loss_wait` once at worst).
fn new_install(kafka: &Kafka, limiter: &Arc<Limiter<RedisStore>>) {
    if !kafka.new_install {
        return;
    }
    limiter.set_new_install(true);
    let (consumer, partitions) = (kafka.consumer.clone(), kafka.jobs_partitions);
    let weak = Arc::downgrade(limiter);
    limiter.set_install_check(Arc::new(move || {
        let (consumer, weak) = (consumer.clone(), weak.clone());
        Box::pin(async move {
            let c = consumer.clone();
            let read = tokio::task::spawn_blocking(move || {
                c.never_committed(partitions, METADATA_TIMEOUT)
            })
            .await;
            match read {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    return Err(
                        "the consumer group has committed since this replica started".to_owned(),
                    )
                }
                Ok(Err(e)) => return Err(format!("could not read the group's commits again: {e}")),
                Err(e) => return Err(format!("could not read the group's commits again: {e}")),
            }
            // The epoch first, then the commit: a replica that reads the
            // group as begun and finds no epoch knows Redis lost it since.
            let Some(limiter) = weak.upgrade() else {
                return Err("the worker is stopping".to_owned());
            };
            if let Err(e) = limiter.begin_install().await {
                return Err(format!("could not write the new install's epoch: {e}"));
            }
            match consumer.commit_start().await {
                Ok(0) => Err("no record to commit a start position for".to_owned()),
                Ok(_) => Ok(()),
                Err(e) => Err(format!(
                    "could not commit this replica's start positions: {e}"
                )),
            }
        })
    }));
}

/// The downstream client, as the settings configure it.
fn downstream(settings: &Settings, worker_id: &str) -> Result<Downstream, StartError> {
    let d = &settings.downstream;
    Ok(Downstream::new(&d.url, d.timeout, d.concurrency)
        .map_err(StartError::Downstream)?
        .with_max_retry_after(d.max_retry_after)
        .with_retry_statuses(d.retry_statuses.clone())
        .with_worker_id(worker_id))
}

/// The limiter on Redis (its scripts loaded) and the consumers' handoff ledger beside it.
async fn limiter(
    settings: &Settings,
    policy: Policy,
    worker_id: &str,
) -> Result<(Limiter<RedisStore>, RedisLedger), StartError> {
    let store = RedisStore::open(&settings.redis)
        .await
        .map_err(StartError::Redis)?;
    // Sellers the config names get series of their own; all others are
    // counted together, so /metrics stays small with any number of sellers.
    crate::telemetry::metrics::name_sellers(policy.named_sellers().map(str::to_owned));
    let prefix = &settings.redis.key_prefix;
    let ledger = RedisLedger::new(store.clone(), prefix, &settings.kafka.group_id);
    let keys = KeySpace::new(prefix.clone());
    let limiter = Limiter::new(store, keys, policy, settings.redis.topology)
        .with_state_loss(settings.redis.on_state_loss)
        .with_state_loss_wait(settings.redis.state_loss_wait)
        .with_restore(worker_id, settings.redis.restore_bytes);
    // Not fatal: a shape not loaded now loads with its first call.
    let prepared = limiter.prepare_shapes().await;
    crate::telemetry::events::ShapesPrepared {
        error: prepared.err().map(|e| e.to_string()).as_deref(),
    }
    .emit();
    Ok((limiter, ledger))
}

/// The Kafka side, started: the consumers, subscribed and polling, and
/// the producer of retry and dead-letter copies.
struct Kafka {
    consumer: Arc<Consumers>,
    sink: Arc<RecordSink>,
    records: mpsc::Receiver<Record>,
    partitions: mpsc::UnboundedReceiver<PartitionEvent>,
    /// Partitions of the jobs topic.
    jobs_partitions: usize,
    /// The consumer group had never committed when this replica started.
    new_install: bool,
}

impl Kafka {
    fn start(settings: &Settings, ledger: RedisLedger) -> Result<Kafka, StartError> {
        let (part_tx, partitions) = mpsc::unbounded_channel();
        let k = &settings.kafka;
        let ledger = Some(Arc::new(ledger) as Arc<dyn crate::kafka::ledger::Ledger>);
        let consumer = Consumers::new(k, part_tx, ledger, settings.revoke_wait())
            .map_err(StartError::Kafka)?;
        let all = k.all_topics();
        let topics: Vec<&str> = all.iter().map(String::as_str).collect();
        let check =
            tokio::task::block_in_place(|| consumer.check_topics(&topics, METADATA_TIMEOUT));
        let counts = check.map_err(StartError::Topics)?;
        // Read before this fleet commits anything: a group that never
        // committed is a new install, not a loss of Redis' data.
        let never_committed =
            tokio::task::block_in_place(|| consumer.never_committed(counts[0], METADATA_TIMEOUT));
        let new_install = match never_committed {
            Ok(new) => new,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the group's committed offsets: a missing limiter state will be read as lost (redis.on_state_loss)");
                false
            }
        };
        debug_assert_eq!(
            topics[0], k.topic,
            "all_topics() starts with the jobs topic"
        );
        let sink = RecordSink::new(&k.brokers, &settings.producer_config())
            .map_err(StartError::Producer)?;
        // The jobs topic to one consumer, every retry tier (all but the
        // jobs and the dead-letter topic) to the other.
        consumer
            .subscribe(&topics[1..topics.len() - 1])
            .map_err(StartError::Subscribe)?;
        let ordering = Ordering::from_settings(&settings.worker);
        let records = consumer
            .start(ordering.header())
            .map_err(StartError::Consumer)?;
        Ok(Kafka {
            consumer: Arc::new(consumer),
            sink: Arc::new(sink),
            records,
            partitions,
            jobs_partitions: counts[0],
            new_install,
        })
    }
}

/// Watches the config file (and SIGHUP) for `[limits]` edits, when there
/// is a file to watch.
fn watch(
    config_file: Option<PathBuf>,
    limiter: &Arc<Limiter<RedisStore>>,
    settings: &Settings,
) -> Result<Option<JoinHandle<()>>, StartError> {
    if config_file.is_some() || settings.limits.file.is_some() {
        return Ok(Some(reload::spawn(
            config_file,
            limiter.clone(),
            settings.clone(),
        )?));
    }
    // SIGHUP's default action ends the process: with nothing to reload it
    // must still be caught, or a `kill -HUP` meant as "reload" (the
    // the book's advice, docs/src/deploy/kubernetes.md) kills a worker that watches no file.
    #[cfg(unix)]
    reload::ignore_hangup().map_err(reload::ReloadError::Signal)?;
    Ok(None)
}

/// The OTLP export of job spans, when an endpoint is set.
fn traces(settings: &Settings, worker_id: &str) -> Result<Option<Export>, StartError> {
    let t = &settings.tracing;
    let traces = Export::start(&t.otlp_endpoint, t.sample_ratio, &t.service_name, worker_id)
        .map_err(StartError::Traces)?;
    if traces.is_some() {
        tracing::info!(
            endpoint = %crate::config::redact_url(&t.otlp_endpoint),
            sample_ratio = t.sample_ratio,
            "exporting job spans through OTLP"
        );
    }
    Ok(traces)
}

/// Closes the Kafka clients and the span export. Closing a librdkafka
/// client blocks (leaving the group, flushing): it runs off the async
/// threads, and a broker that stopped answering does not hold the process
/// forever.
async fn close(consumer: Arc<Consumers>, sink: Arc<RecordSink>, traces: Option<Export>) {
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
