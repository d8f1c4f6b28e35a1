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

/// A seller's hold: `held_by` is what holds it now (see
/// `worker::waits`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldLabels {
    pub seller: String,
    pub held_by: String,
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
    /// Records taken from Kafka.
    pub jobs_received: Counter,
    /// Jobs the downstream accepted.
    pub jobs_done: Counter,
    /// Jobs written to the dead-letter topic, by kind (`reason` is the
    /// record's `x-error-kind`): see [Dead-letter kinds](dead-letter-kinds.md).
    pub jobs_dead_lettered: Family<ReasonLabel, Counter>,
    /// Jobs deferred through a retry tier.
    pub jobs_to_retry_topic: Counter,
    /// Retry or dead-letter copies the broker refused as too large, by what was
    /// done instead: `dead_letter_without_payload`, `kept_in_memory`.
    pub records_too_large: Family<ReasonLabel, Counter>,
    /// Jobs whose ordering key (`worker.ordering_key`) was not in the record,
    /// by what ordered them instead: `record_key`, or `partition` (no record
    /// key either: the job went one at a time with its seller's others of
    /// its partition). A steady count means the key is read from the wrong
    /// place.
    pub ordering_key_missing: Family<ReasonLabel, Counter>,
    /// Job records whose `traceparent` is not valid W3C trace context (`shape`,
    /// `not_hex`, `version`, `zero_trace_id`, `zero_parent_id`); each job went
    /// on in a new trace (see [Tracing](../operate/observability.md#tracing)).
    pub trace_context_invalid: Family<ReasonLabel, Counter>,
    /// Downstream calls that failed (5xx, timeout, connection) and are tried
    /// again after a backoff; a job that keeps failing is dead-lettered as
    /// `attempts_exhausted` after `downstream.max_attempts`.
    pub jobs_retried: Counter,
    /// Waiting or finished-too-late work of revoked partitions, left to the new
    /// owner.
    pub jobs_dropped_on_revoke: Counter,
    /// Redelivered records the previous owner had finished (named in its commit
    /// metadata or the handoff ledger), skipped.
    pub jobs_already_done: Counter,
    /// Histogram of how long a revoke took inside the rebalance: the wait for
    /// its partitions' calls under way (at most `worker.revoke_wait`) and the
    /// commit. The group's rebalance waits for the slowest member's.
    pub revoke_duration: Histogram,
    /// Revokes that stopped waiting at `worker.revoke_wait` with work still
    /// under way: a success that lands later is done again by the next owner.
    pub revoke_waits_expired: Counter,
    /// Times a consumer of this replica fenced itself, by `reason`:
    /// `stalled` (the process silent past the session timeout, less a
    /// heartbeat interval) or `assignment_lost` (librdkafka lost it). A
    /// fenced consumer starts no downstream call until its ownership is
    /// confirmed again (issue 53).
    pub session_fences: Family<ReasonLabel, Counter>,
    /// This replica's consumers fenced now (0, 1 or 2).
    pub sessions_fenced: Gauge,
    /// Jobs not called because their slot of `max_in_flight` had lapsed
    /// by this replica's clock (or would, before the call's timeout): asked
    /// for again.
    pub jobs_lease_lapsed: Counter,
    /// Jobs the limiter admitted (each job once, whatever its cost).
    pub jobs_admitted: Counter,
    /// Units the limiter admitted: the sum of the admitted jobs' costs.
    pub units_admitted: Counter,
    /// Units of granted jobs that were never called here (their partition was revoked, or the replica stopped, before their calls), given back to their sellers' rules, each rule only what is provably unused.
    pub units_given_back: Counter,
    /// Jobs let through by `redis.on_error = fail_open` or `local` while Redis
    /// failed.
    pub jobs_admitted_without_redis: Counter,
    /// Partition heads sent round the retry topic so the partition could
    /// commit.
    pub heads_moved: Counter,
    /// Downstream answers: `2xx`, `429`, `4xx`, `5xx`, `other`, `timeout`,
    /// `error` (connection).
    pub downstream_requests: Family<ClassLabel, Counter>,
    /// Histogram of downstream call latency.
    pub downstream_request_duration: Histogram,
    /// 429s whose `Retry-After` was over `downstream.max_retry_after`.
    pub downstream_retry_after_clamped: Counter,
    /// 1 while the downstream is held as out of service (calls failing across
    /// jobs): jobs keep their attempts, only probes go out.
    pub downstream_outage: Gauge,
    /// Downstream outages begun.
    pub downstream_outages: Counter,
    /// Calls this replica lets out to the downstream at once: the adaptive
    /// limit (`downstream.adaptive_concurrency`), else
    /// `downstream.concurrency`. Below the ceiling, the downstream said it
    /// could take no more: compare with `jobs_in_flight` and the 5xx rate.
    pub downstream_concurrency_limit: Gauge,
    /// Moves of the adaptive limit, by `reason`: `overload` (a call shed or
    /// unreached: 502, 503, 504, timeout, refused), `latency` (a window of
    /// calls slower than `downstream.latency_tolerance` times unloaded),
    /// `growth` (every slot in use and the downstream kept up).
    pub downstream_concurrency_changes: Family<ReasonLabel, Counter>,
    /// Drops of a seller's learnt limit on a downstream 429
    /// (`limits.learn`), fleet-wide, counted by the replica that met it.
    pub limit_learnt_drops: Counter,
    /// Sellers paused one by one (`limits pause SELLER`), as this replica last
    /// read them.
    pub paused_sellers: Gauge,
    /// 1 while every seller is paused (`limits pause --all`).
    pub paused_all: Gauge,
    /// Limiter asks made (one per seller batch, not per job); asks that arrive
    /// together share one Redis call (`throttle_limiter_asks_per_call`).
    pub limiter_calls: Counter,
    /// `result` is `granted`, `denied`, `never` (a job over a rule's capacity)
    /// or `shadow_denied` (a shadow rule would have held units back); `by`
    /// names what refused: `rule0`, `rule1`, … in the seller's rule order with
    /// global rules after them, `shadow0`, … for shadow rules,
    /// `downstream_429`, `unavailable`, `max_in_flight` (every slot of the
    /// seller's `max_in_flight` taken, fleet-wide: the seller waits for
    /// capacity); `tier` is the seller's tier, or `default`, `seller` (rules of
    /// its own), `override`, `unlimited`.
    pub limiter_decisions: Family<DecisionLabels, Counter>,
    /// Grants after which the seller's tightest rule (the one with the fewest
    /// units left, which the script names) has at most a fifth of its capacity
    /// left (80 % used, envoy ratelimit's `near_limit`): a seller that keeps
    /// appearing here is about to be throttled. A large rule nearly spent
    /// beside a fresh small one counts (it did not before issue 21, when
    /// `remaining` was compared with the smallest capacity).
    pub limiter_near_limit: Family<TierSellerLabels, Counter>,
    /// Units shadow rules would have held back (the jobs went through).
    pub limiter_shadow_denied_units: Family<TierSellerLabels, Counter>,
    /// Jobs that arrived while their seller was known refused or held by a 429,
    /// and so joined its queue without a limiter call (a worker asking per job
    /// would have called Redis to be refused).
    pub limiter_calls_avoided: Family<SellerLabel, Counter>,
    /// Histogram of the waits refused sellers were given.
    pub limiter_retry_after: Histogram,
    /// Failed Redis calls: `timeout`, `connection`, `server`, and `shadow` for
    /// a failed shadow-rule call.
    pub limiter_errors: Family<KindLabel, Counter>,
    /// Histogram of Redis call latency (`kind="script"`).
    pub redis_call_duration: SecondsHistogram,
    /// Histogram of sellers' asks carried by one coalesced limiter call
    /// (`redis.max_coalesced`); a mean near 1 under load means the asks do not
    /// arrive together.
    pub limiter_asks_per_call: Histogram,
    /// Offset commits the broker acknowledged.
    pub offset_commits: Counter,
    /// Offset commits that failed; the next commit carries the same offsets.
    pub offset_commit_errors: Counter,
    /// Reads and writes of the handoff ledger (what each commit says is
    /// finished, in Redis) that failed; a partition handed over meanwhile
    /// relies on the broker's commit alone.
    pub handoff_ledger_errors: Counter,
    /// Losses of the limiter's state in Redis that this replica found (a
    /// restart without persistence, a failover to a replica that missed writes,
    /// an eviction; not a new install): one per loss across the fleet, one per hash
    /// slot in a cluster; see [Redis data
    /// loss](../concepts/guarantees.md#redis-data-loss).
    pub limiter_state_lost: Counter,
    /// Sellers' states found gone back behind this replica's own grants (a
    /// partial loss: a failover to a replica that missed the last writes,
    /// a key put back from an older copy); each holds its seller for
    /// `redis.state_loss_wait` while the fleet restores it.
    pub limiter_rollbacks_found: Counter,
    /// Units this replica wrote back to Redis after a loss of the
    /// limiter's state: its own grants, restored (`redis.state_loss_wait`).
    pub limiter_units_restored: Counter,
    /// Bytes this replica keeps of its recent grants for restores
    /// (`redis.restore_bytes` bounds it).
    pub limiter_restore_bytes: Gauge,
    /// Sellers' parts forgotten for `redis.restore_bytes`: after a loss,
    /// their grants by this replica are not restored.
    pub limiter_restore_evicted: Counter,
    /// Consumer errors (broker down, transport).
    pub kafka_errors: Counter,
    /// Partition assignments received.
    pub rebalances: Counter,
    /// Times fetching paused at `worker.max_buffered` or
    /// `worker.max_buffered_bytes`.
    pub backpressure_pauses: Counter,
    /// Limit edits applied live, without a restart.
    pub config_reloads: Counter,
    /// Limit edits rejected: the limits in force stay, the log names the file,
    /// the key and the problem.
    pub config_reload_errors: Counter,
    /// Downstream slots in use (of `downstream.concurrency`).
    pub jobs_in_flight: Gauge,
    /// Jobs in memory waiting: `cause="limit"` for a seller's limit or a 429
    /// hold, `cause="capacity"` for a downstream slot (this replica's
    /// `downstream.concurrency`, or the seller's `max_in_flight` across the
    /// fleet) or a backoff after a failed call, `cause="paused"` for an
    /// operator's pause (`limits pause`).
    pub jobs_waiting: Family<WaitingLabels, Gauge>,
    /// Retry-tier records held until their release time (their partitions are
    /// paused).
    pub jobs_parked: Gauge,
    /// Bytes of jobs in memory (bounded by `worker.max_buffered_bytes`).
    pub buffered_bytes: Gauge,
    /// `worker.max_buffered_bytes` of this replica, so that alerts and the
    /// dashboard can compare `throttle_buffered_bytes` with it.
    pub max_buffered_bytes: Gauge,
    /// 1 when `/readyz` answers 200 (started, in the group, Redis answering),
    /// else 0; taken at each scrape.
    pub ready: Gauge,
    /// Partitions this replica holds, every topic.
    pub assigned_partitions: Gauge,
    /// Partitions this replica does not fetch from: backpressure, or parked
    /// retry-tier records.
    pub paused_partitions: Gauge,
    /// High watermark minus committed offset of each partition this replica
    /// holds (librdkafka statistics, every `statistics.interval.ms`, 5 s by
    /// default).
    pub consumer_lag: Family<PartitionLabels, Gauge>,
    /// Age of the partition's oldest record taken but not finished (its Kafka
    /// timestamp), 0 when all are finished.
    pub consumer_lag_seconds: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    /// Age of each seller's oldest job waiting in this replica's memory
    /// (queued, backing off or paced), for the named sellers (of
    /// `limits.sellers`) and the 10 others that have waited longest; the
    /// rest together as `seller="other"` (the oldest of them, 0 when none
    /// waits). A seller with nothing waiting has no series. Alert:
    /// `ThrottleWorkerSellerWaitingTooLong`.
    pub seller_oldest_wait_seconds: Family<SellerLabel, Gauge<f64, AtomicU64>>,
    /// How long each seller's waiting jobs take to drain at its slowest
    /// rule's sustained rate (limit per period), for the same sellers as
    /// `seller_oldest_wait_seconds`; none for an unlimited seller.
    pub seller_drain_seconds: Family<SellerLabel, Gauge<f64, AtomicU64>>,
    /// 1 for what holds each seller with jobs waiting now, as `held_by`:
    /// `pause`, `rule N`, `downstream_429`, `max_in_flight`,
    /// `limiter_unavailable`, `outage`, `adaptive_concurrency`, `capacity`
    /// or `running` (nothing holds it), for the same sellers as
    /// `seller_oldest_wait_seconds`; for `seller="other"`, how many of the
    /// others each holds (`held_by="none"` at 0 when no other waits).
    pub seller_held: Family<HeldLabels, Gauge>,
    /// The sum over this replica's partitions of the topic; `sum by (group,
    /// topic)` over replicas is the group's lag.
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
            ordering_key_missing: reg!(
                "ordering_key_missing",
                "Jobs whose ordering key (worker.ordering_key) was not in the record, by what ordered them instead: record_key, partition",
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
            revoke_duration: reg!(
                "revoke_duration_seconds",
                "How long a revoke took in the rebalance: the wait for its calls under way, then its commit",
                seconds_histogram()
            ),
            revoke_waits_expired: reg!(
                "revoke_waits_expired",
                "Revokes that stopped waiting at worker.revoke_wait with work still under way",
                Counter::default()
            ),
            session_fences: reg!(
                "session_fences",
                "Times a consumer fenced itself (its session may be lost): no call starts until its ownership is confirmed, by reason",
                Family::default()
            ),
            sessions_fenced: reg!(
                "sessions_fenced",
                "This replica's consumers fenced now: they start no downstream call",
                Gauge::default()
            ),
            jobs_lease_lapsed: reg!(
                "jobs_lease_lapsed",
                "Jobs not called because their max_in_flight slot had lapsed (or would during the call) by this replica's clock; asked for again",
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
            units_given_back: reg!(
                "units_given_back",
                "Units of granted jobs never called here (a revoke, a shutdown), given back to their sellers' rules",
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
            downstream_concurrency_limit: reg!(
                "downstream_concurrency_limit",
                "Calls this replica lets out to the downstream at once (the adaptive limit, or downstream.concurrency)",
                Gauge::default()
            ),
            downstream_concurrency_changes: reg!(
                "downstream_concurrency_changes",
                "Moves of the adaptive downstream concurrency limit, by reason: overload, latency, growth",
                Family::default()
            ),
            limit_learnt_drops: reg!(
                "limit_learnt_drops",
                "Drops of a seller's learnt limit on a downstream 429 (limits.learn), counted by the replica that met it",
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
                "Losses of the limiter's state in Redis found by this replica (a restart without persistence, a failover, an eviction; not a new install): one per loss fleet-wide, per hash slot in a cluster",
                Counter::default()
            ),
            limiter_rollbacks_found: reg!(
                "limiter_rollbacks_found",
                "Sellers' states this replica found gone back behind its own grants (a partial loss of Redis' data); each holds its seller for redis.state_loss_wait while the fleet restores it",
                Counter::default()
            ),
            limiter_units_restored: reg!(
                "limiter_units_restored",
                "Units this replica wrote back to Redis after a loss of the limiter's state (its own grants before the loss)",
                Counter::default()
            ),
            limiter_restore_bytes: reg!(
                "limiter_restore_bytes",
                "Bytes this replica keeps of its recent grants to restore them after a loss (bounded by redis.restore_bytes)",
                Gauge::default()
            ),
            limiter_restore_evicted: reg!(
                "limiter_restore_evicted",
                "Sellers' grant records forgotten for redis.restore_bytes: their part is not restored after a loss",
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
            seller_oldest_wait_seconds: reg!(
                "seller_oldest_wait_seconds",
                "Age of each seller's oldest job waiting in this replica (named sellers and the 10 oldest others; the rest as other)",
                Family::default()
            ),
            seller_drain_seconds: reg!(
                "seller_drain_seconds",
                "Time for each seller's waiting jobs to drain at its slowest rule's rate",
                Family::default()
            ),
            seller_held: reg!(
                "seller_held",
                "1 for what holds each seller with jobs waiting (held_by: pause, rule N, downstream_429, max_in_flight, limiter_unavailable, outage, adaptive_concurrency, capacity, running)",
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
