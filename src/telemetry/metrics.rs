//! The process' Prometheus metrics, kept by `prometheus-client` and served
//! at `/metrics`. Only [`super::events`] moves the counters and histograms
//! (each event logs and counts in one place); the gauges are set from
//! snapshots the worker takes (backlog by cause, partitions), from
//! librdkafka's statistics (consumer lag), from the settings at startup
//! (`max_buffered_bytes`, so alerts can compare `buffered_bytes` with it)
//! and from the readiness at each scrape (`ready`).
//!
//! Cardinality is bounded: a seller gets its own series only when the
//! config names it ([`name_sellers`]); every other seller is counted under
//! `seller="other"`. Partition labels are bounded by the topics' partition
//! counts, reasons and classes are fixed strings.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{OnceLock, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The seller label of every seller the config does not name.
pub const OTHER_SELLER: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// A limiter decision: `result` is `granted`, `denied`, `never` or
/// `shadow_denied`; `by` names what refused (`rule0`, `rule1`, … in the
/// seller's rule order with global rules after them, `shadow0`, … in the
/// order of the shadow rules, `downstream_429`, `unavailable`), empty for a
/// grant; `tier` is the seller's tier (or `default`, `seller`, `override`,
/// `unlimited`), bounded by the config like `seller`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub result: &'static str,
    pub by: String,
    pub tier: String,
    pub seller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierSellerLabels {
    pub tier: String,
    pub seller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SellerLabel {
    pub seller: String,
}

/// Jobs in memory by why they wait: `limit` (a seller's limit or a 429
/// hold), `capacity` (a downstream slot, or a backoff after a failed call).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabels {
    pub cause: &'static str,
    pub seller: String,
}

/// The labels kminion and kafka-lag-exporter users know.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub group: String,
    pub topic: String,
}

type SecondsHistogram = Family<KindLabel, Histogram, fn() -> Histogram>;

/// Every series of the process.
pub struct Metrics {
    registry: Registry,
    pub jobs_received: Counter,
    pub jobs_done: Counter,
    pub jobs_dead_lettered: Family<ReasonLabel, Counter>,
    pub jobs_to_retry_topic: Counter,
    pub records_too_large: Family<ReasonLabel, Counter>,
    pub trace_context_invalid: Family<ReasonLabel, Counter>,
    pub jobs_retried: Counter,
    pub jobs_dropped_on_revoke: Counter,
    pub jobs_already_done: Counter,
    pub jobs_admitted: Counter,
    pub units_admitted: Counter,
    pub jobs_admitted_without_redis: Counter,
    pub heads_moved: Counter,
    pub downstream_requests: Family<ClassLabel, Counter>,
    pub downstream_request_duration: Histogram,
    pub downstream_retry_after_clamped: Counter,
    pub downstream_outage: Gauge,
    pub downstream_outages: Counter,
    pub paused_sellers: Gauge,
    pub paused_all: Gauge,
    pub limiter_calls: Counter,
    pub limiter_decisions: Family<DecisionLabels, Counter>,
    pub limiter_near_limit: Family<TierSellerLabels, Counter>,
    pub limiter_shadow_denied_units: Family<TierSellerLabels, Counter>,
    pub limiter_calls_avoided: Family<SellerLabel, Counter>,
    pub limiter_retry_after: Histogram,
    pub limiter_errors: Family<KindLabel, Counter>,
    pub redis_call_duration: SecondsHistogram,
    pub limiter_asks_per_call: Histogram,
    pub offset_commits: Counter,
    pub offset_commit_errors: Counter,
    pub handoff_ledger_errors: Counter,
    pub limiter_state_lost: Counter,
    pub kafka_errors: Counter,
    pub rebalances: Counter,
    pub backpressure_pauses: Counter,
    pub config_reloads: Counter,
    pub config_reload_errors: Counter,
    pub jobs_in_flight: Gauge,
    pub jobs_waiting: Family<WaitingLabels, Gauge>,
    pub jobs_parked: Gauge,
    pub buffered_bytes: Gauge,
    pub max_buffered_bytes: Gauge,
    pub ready: Gauge,
    pub assigned_partitions: Gauge,
    pub paused_partitions: Gauge,
    pub consumer_lag: Family<PartitionLabels, Gauge>,
    pub consumer_lag_seconds: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    pub consumer_topic_lag: Family<TopicLabels, Gauge>,
}

fn seconds_histogram() -> Histogram {
    // 100 µs to ~52 s: a Redis call, a downstream call, a retry-after.
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("throttle");
        macro_rules! reg {
            ($name:literal, $help:literal, $metric:expr) => {{
                let m = $metric;
                registry.register($name, $help, m.clone());
                m
            }};
        }
        Metrics {
            jobs_received: reg!(
                "jobs_received",
                "Records taken from Kafka",
                Counter::default()
            ),
            jobs_done: reg!(
                "jobs_done",
                "Jobs the downstream accepted",
                Counter::default()
            ),
            jobs_dead_lettered: reg!(
                "jobs_dead_lettered",
                "Jobs written to the dead-letter topic, by reason",
                Family::default()
            ),
            jobs_to_retry_topic: reg!(
                "jobs_to_retry_topic",
                "Jobs deferred through a retry tier",
                Counter::default()
            ),
            records_too_large: reg!(
                "records_too_large",
                "Records the broker refused as too large to copy, by what the worker did instead: dead_letter_without_payload, kept_in_memory",
                Family::default()
            ),
            trace_context_invalid: reg!(
                "trace_context_invalid",
                "Job records whose traceparent header is not valid W3C trace context (the job starts a new trace), by reason",
                Family::default()
            ),
            jobs_retried: reg!(
                "jobs_retried",
                "Downstream calls that failed (5xx, timeout, connection) and will be tried again after a backoff",
                Counter::default()
            ),
            jobs_dropped_on_revoke: reg!(
                "jobs_dropped_on_revoke",
                "Jobs of revoked partitions left to their new owner",
                Counter::default()
            ),
            jobs_already_done: reg!(
                "jobs_already_done",
                "Redelivered records the previous owner had finished, skipped",
                Counter::default()
            ),
            jobs_admitted: reg!(
                "jobs_admitted",
                "Jobs the limiter admitted",
                Counter::default()
            ),
            units_admitted: reg!(
                "units_admitted",
                "Units (job costs) the limiter admitted",
                Counter::default()
            ),
            jobs_admitted_without_redis: reg!(
                "jobs_admitted_without_redis",
                "Jobs admitted by redis.on_error = fail_open or local while the limiter failed",
                Counter::default()
            ),
            heads_moved: reg!(
                "heads_moved",
                "Partition heads sent round the retry topic so the partition commits",
                Counter::default()
            ),
            downstream_requests: reg!(
                "downstream_requests",
                "Downstream calls by answer: 2xx, 429, 4xx, 5xx, timeout, error",
                Family::default()
            ),
            downstream_request_duration: reg!(
                "downstream_request_duration_seconds",
                "Downstream call latency",
                seconds_histogram()
            ),
            downstream_retry_after_clamped: reg!(
                "downstream_retry_after_clamped",
                "429 Retry-After values over downstream.max_retry_after",
                Counter::default()
            ),
            downstream_outage: reg!(
                "downstream_outage",
                "1 while the downstream is held as out of service (calls failing across jobs): no attempt is spent, only probes go out",
                Gauge::default()
            ),
            downstream_outages: reg!(
                "downstream_outages",
                "Downstream outages begun",
                Counter::default()
            ),
            paused_sellers: reg!(
                "paused_sellers",
                "Sellers paused one by one by an operator (limits pause), as this replica last read them",
                Gauge::default()
            ),
            paused_all: reg!(
                "paused_all",
                "1 while every seller is paused by an operator (limits pause --all), as this replica last read it",
                Gauge::default()
            ),
            limiter_calls: reg!("limiter_calls", "Limiter calls made", Counter::default()),
            limiter_decisions: reg!(
                "limiter_decisions",
                "Limiter decisions by result, refusing rule, tier and named seller",
                Family::default()
            ),
            limiter_near_limit: reg!(
                "limiter_near_limit",
                "Grants after which the seller has at most a fifth of its smallest rule's capacity left (80 % of a window used)",
                Family::default()
            ),
            limiter_shadow_denied_units: reg!(
                "limiter_shadow_denied_units",
                "Units that rules in shadow mode would have held back (the jobs went through)",
                Family::default()
            ),
            limiter_calls_avoided: reg!(
                "limiter_calls_avoided",
                "Limiter calls not made because the seller was known to be refused or blocked until later",
                Family::default()
            ),
            limiter_retry_after: reg!(
                "limiter_retry_after_seconds",
                "How long refused sellers were told to wait",
                seconds_histogram()
            ),
            limiter_errors: reg!(
                "limiter_errors",
                "Limiter calls that failed, by kind (timeout, unavailable)",
                Family::default()
            ),
            redis_call_duration: reg!(
                "redis_call_duration_seconds",
                "Redis call latency, by kind (script)",
                Family::new_with_constructor(seconds_histogram as fn() -> Histogram)
            ),
            limiter_asks_per_call: reg!(
                "limiter_asks_per_call",
                "Sellers' asks carried by one coalesced limiter call",
                Histogram::new(exponential_buckets(1.0, 2.0, 9))
            ),
            offset_commits: reg!(
                "offset_commits",
                "Offset commits acknowledged",
                Counter::default()
            ),
            offset_commit_errors: reg!(
                "offset_commit_errors",
                "Offset commits that failed",
                Counter::default()
            ),
            handoff_ledger_errors: reg!(
                "handoff_ledger_errors",
                "Reads and writes of the handoff ledger (finished offsets kept in Redis beside each commit) that failed",
                Counter::default()
            ),
            limiter_state_lost: reg!(
                "limiter_state_lost",
                "Losses of the limiter's state in Redis found by this replica (a restart without persistence, a failover, an eviction, a new install): one per loss fleet-wide, per hash slot in a cluster",
                Counter::default()
            ),
            kafka_errors: reg!(
                "kafka_errors",
                "Kafka consumer errors (broker down, transport)",
                Counter::default()
            ),
            rebalances: reg!(
                "rebalances",
                "Partition assignments received from the group",
                Counter::default()
            ),
            backpressure_pauses: reg!(
                "backpressure_pauses",
                "Times fetching paused at worker.max_buffered or max_buffered_bytes",
                Counter::default()
            ),
            config_reloads: reg!(
                "config_reloads",
                "Limit edits applied without a restart",
                Counter::default()
            ),
            config_reload_errors: reg!(
                "config_reload_errors",
                "Config edits rejected (the limits in force stay)",
                Counter::default()
            ),
            jobs_in_flight: reg!(
                "jobs_in_flight",
                "Downstream slots in use (calls under way or about to start)",
                Gauge::default()
            ),
            jobs_waiting: reg!(
                "jobs_waiting",
                "Jobs in memory waiting, by cause (limit, capacity) and named seller",
                Family::default()
            ),
            jobs_parked: reg!(
                "jobs_parked",
                "Retry-tier records held until their release time",
                Gauge::default()
            ),
            buffered_bytes: reg!(
                "buffered_bytes",
                "Bytes of jobs in memory (worker.max_buffered_bytes bounds it)",
                Gauge::default()
            ),
            max_buffered_bytes: reg!(
                "max_buffered_bytes",
                "worker.max_buffered_bytes of this replica: fetching pauses when buffered_bytes reaches it",
                Gauge::default()
            ),
            ready: reg!(
                "ready",
                "1 when /readyz answers 200 (started, in the group, Redis answering), else 0; set at each scrape",
                Gauge::default()
            ),
            assigned_partitions: reg!(
                "assigned_partitions",
                "Partitions assigned to this replica, every topic",
                Gauge::default()
            ),
            paused_partitions: reg!(
                "paused_partitions",
                "Assigned partitions not fetched (backpressure, parked retry records)",
                Gauge::default()
            ),
            consumer_lag: reg!(
                "consumer_lag_messages",
                "High watermark minus committed offset, per assigned partition",
                Family::default()
            ),
            consumer_lag_seconds: reg!(
                "consumer_lag_seconds",
                "Age of the oldest unfinished record, per assigned partition",
                Family::default()
            ),
            consumer_topic_lag: reg!(
                "consumer_topic_lag_messages",
                "Sum of consumer_lag_messages over this replica's partitions of a topic",
                Family::default()
            ),
            registry,
        }
    }

    /// The text exposition (OpenMetrics), `# EOF` included.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The metrics of this process.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

fn named() -> &'static RwLock<HashSet<String>> {
    static NAMED: OnceLock<RwLock<HashSet<String>>> = OnceLock::new();
    NAMED.get_or_init(Default::default)
}

/// Sellers that get series of their own: those the config names.
pub fn name_sellers<I: IntoIterator<Item = String>>(sellers: I) {
    let mut set = named().write().unwrap_or_else(|p| p.into_inner());
    set.clear();
    set.extend(sellers);
}

/// The `seller` label of `seller`: its id if the config names it, else
/// [`OTHER_SELLER`].
pub fn seller_label(seller: &str) -> String {
    let set = named().read().unwrap_or_else(|p| p.into_inner());
    if set.contains(seller) {
        seller.to_owned()
    } else {
        OTHER_SELLER.to_owned()
    }
}
