//! `throttle-worker dlq replay`: the matching dead letters written back to
//! the jobs topic, each exactly once, however often the replay is killed
//! and run again (see docs/dlq-replay.md for why not Kafka transactions).
//!
//! A replayed record keeps its key, its value byte for byte (so its job id,
//! and the downstream's `Idempotency-Key`, stay the same) and its trace
//! headers; it gets `x-replayed-from: <dlq topic>:<partition>:<offset>` and
//! none of the worker's own headers, so it starts with fresh attempts and
//! is not taken for a retry-tier record.
//!
//! Exactly once: each dead letter has a marker in Redis (one hash per
//! dead-letter topic, [`KeySpace::dlq_replay`]). Before its copy is written
//! the marker says `pending <jobs partition> <offset>`, the partition's
//! high watermark then, and after the broker acknowledged it `done`. A run
//! that finds `done` skips the record; one that finds `pending` (a run
//! killed between the two) reads that jobs partition from that offset for
//! a record replayed from this one, and writes it again only if there is
//! none. (A lookup by time would spare the watermark read per record, but
//! librdkafka's mock cluster answers none, so it could not be tested.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::config::Settings;
use crate::kafka::producer::X_REPLAYED_FROM;
use crate::kafka::{ReadRecord, ReaderError, RecordSink, SinkError, TopicReader};
use crate::limiter::{KeySpace, RedisError, RedisStore};

use super::{line, scan, DeadLetter, DlqError, Filter, Progress};

/// How long a replay's markers are kept after its last write: past any
/// dead-letter retention an operator is likely to run.
const MARKER_TTL: Duration = Duration::from_secs(30 * 86_400);

/// The trace headers a replayed record keeps.
const KEPT_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// How a replay runs.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// List what would go; write nothing, mark nothing.
    pub dry_run: bool,
    /// Replay records replayed before, too.
    pub again: bool,
    /// At most this many records a second.
    pub rate: Option<f64>,
    /// How `--dry-run` lists: lines, or JSON Lines.
    pub output: crate::operator::Output,
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Replayed {
    /// Dead letters the filter matched.
    pub matched: u64,
    /// Written to the jobs topic by this run (with `--dry-run`: would be).
    pub replayed: u64,
    /// Skipped: replayed before.
    pub already: u64,
    /// Skipped: written by an interrupted run, found in the jobs topic.
    pub recovered: u64,
}

impl Replayed {
    pub fn text(&self, topic: &str, dry_run: bool) -> String {
        let verb = if dry_run { "would replay" } else { "replayed" };
        format!(
            "{verb} {} of {} matching dead letters to {topic} ({} replayed before, {} found written by an interrupted run)\n",
            self.replayed, self.matched, self.already, self.recovered
        )
    }
}

impl From<RedisError> for DlqError {
    fn from(e: RedisError) -> DlqError {
        DlqError::Markers(e.to_string())
    }
}

impl From<SinkError> for DlqError {
    fn from(e: SinkError) -> DlqError {
        DlqError::Write(e.to_string())
    }
}

/// Replays the dead letters `filter` matches (see the module's docs);
/// `out` gets the `--dry-run` list.
pub async fn replay(
    settings: &Settings,
    filter: &Filter,
    opts: &ReplayOptions,
    mut progress: impl Progress + Send + 'static,
    out: &mut (dyn std::io::Write + Send),
) -> Result<Replayed, DlqError> {
    let kafka = &settings.kafka;
    let store = RedisStore::open(&settings.redis).await?;
    let markers = KeySpace::new(settings.redis.key_prefix.clone()).dlq_replay(&kafka.dlq_topic);
    let sink = RecordSink::new(&kafka.brokers, &kafka.producer_config())?;
    let (brokers, props, jobs) = (
        kafka.brokers.clone(),
        kafka.consumer_config(),
        kafka.topic.clone(),
    );
    // Watermarks of the jobs topic come from one reader, kept open.
    let jobs_reader = {
        let (b, p, t) = (brokers.clone(), props.clone(), jobs.clone());
        Arc::new(Mutex::new(
            blocking(move || TopicReader::for_watermarks(&b, &p, &t)).await?,
        ))
    };
    let partitions = {
        let reader = jobs_reader.clone();
        blocking(move || Ok(lock(&reader).watermarks()?.len() as i32)).await?
    };

    // The dead letters come from a reading thread, a few at a time.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(DeadLetter, ReadRecord)>(64);
    let reading = {
        let (b, p, t, f) = (
            brokers.clone(),
            props.clone(),
            kafka.dlq_topic.clone(),
            filter.clone(),
        );
        tokio::task::spawn_blocking(move || {
            scan(&b, &p, &t, &f, false, &mut progress, |d, r| {
                let _ = tx.blocking_send((d, r));
            })
        })
    };
    let mut done = Replayed::default();
    let pause = opts
        .rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(1.0 / r));
    while let Some((d, r)) = rx.recv().await {
        done.matched += 1;
        let field = format!("{}:{}", r.partition, r.offset);
        let from = format!("{}:{}:{}", kafka.dlq_topic, r.partition, r.offset);
        match store.hash_field(&markers, &field).await?.as_deref() {
            Some("done") if !opts.again => {
                done.already += 1;
                continue;
            }
            Some(m) if m.starts_with("pending ") && !opts.again => {
                if let Some((partition, offset)) = parse_pending(m) {
                    let (b, p, t, f) = (brokers.clone(), props.clone(), jobs.clone(), from.clone());
                    let found =
                        blocking(move || written(&b, &p, &t, partition, offset, &f)).await?;
                    if found {
                        if !opts.dry_run {
                            store
                                .set_hash_field(&markers, &field, "done", MARKER_TTL)
                                .await?;
                        }
                        done.recovered += 1;
                        continue;
                    }
                }
            }
            _ => {}
        }
        if opts.dry_run {
            match opts.output {
                crate::operator::Output::Table => writeln!(out, "{}", line(&d))?,
                crate::operator::Output::Json => {
                    writeln!(out, "{}", serde_json::to_string(&d).unwrap_or_default())?
                }
            }
            done.replayed += 1;
            continue;
        }
        let partition = target_partition(&d, &r, &jobs, partitions);
        let high = {
            let reader = jobs_reader.clone();
            blocking(move || lock(&reader).high_watermark(partition)).await?
        };
        let pending = format!("pending {partition} {high}");
        store
            .set_hash_field(&markers, &field, &pending, MARKER_TTL)
            .await?;
        let mut headers: Vec<(&str, &[u8])> = r
            .headers
            .iter()
            .filter(|(k, _)| KEPT_HEADERS.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        headers.push((X_REPLAYED_FROM, from.as_bytes()));
        let value = r.value.as_deref().unwrap_or_default();
        sink.produce_to(&jobs, partition, r.key.as_deref(), value, &headers)
            .await?;
        store
            .set_hash_field(&markers, &field, "done", MARKER_TTL)
            .await?;
        done.replayed += 1;
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
    }
    reading
        .await
        .map_err(|e| DlqError::Write(format!("the reading thread failed: {e}")))??;
    Ok(done)
}

/// Runs blocking Kafka reads off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ReaderError> + Send + 'static,
) -> Result<T, DlqError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DlqError::Write(format!("a reading thread failed: {e}")))?
        .map_err(DlqError::from)
}

/// `pending <partition> <offset>`.
fn parse_pending(marker: &str) -> Option<(i32, i64)> {
    let mut parts = marker.split_whitespace().skip(1);
    let partition = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    Some((partition, offset))
}

fn lock(reader: &Mutex<TopicReader>) -> std::sync::MutexGuard<'_, TopicReader> {
    // A reader holds no invariant a panic elsewhere could break.
    reader.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `partition` of `topic` holds, from `start` to its end now, a
/// record replayed from `from`.
fn written(
    brokers: &str,
    props: &BTreeMap<String, String>,
    topic: &str,
    partition: i32,
    start: i64,
    from: &str,
) -> Result<bool, ReaderError> {
    let mut reader = TopicReader::open_partition(brokers, props, topic, partition, start)?;
    let end = reader.end_offsets()?;
    let ends: BTreeMap<i32, i64> = end.into_iter().filter(|(p, _)| *p == partition).collect();
    if ends.get(&partition).is_none_or(|e| *e <= start) {
        return Ok(false);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !reader.reached(&ends) {
        if std::time::Instant::now() >= deadline {
            return Err(ReaderError::Timeout {
                topic: topic.to_owned(),
                ends,
                read_to: reader.read_to().clone(),
                timeout: Duration::from_secs(30),
            });
        }
        for r in reader.poll(Duration::from_millis(100))? {
            if r.header(X_REPLAYED_FROM) == Some(from) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The jobs partition a replayed record goes to: the one its job first
/// entered (the producer's partitioner chose it from the same key), else
/// one chosen from the key.
fn target_partition(d: &DeadLetter, r: &ReadRecord, jobs: &str, partitions: i32) -> i32 {
    let partitions = partitions.max(1);
    if let Some(o) = &d.original {
        if o.topic == jobs && (0..partitions).contains(&o.partition) {
            return o.partition;
        }
    }
    // FNV-1a of the key: stable across runs and builds.
    let hash = r
        .key
        .as_deref()
        .unwrap_or_default()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    (hash % partitions as u64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_marker_names_its_partition_and_offset() {
        assert_eq!(parse_pending("pending 3 1834"), Some((3, 1834)));
        assert_eq!(parse_pending("pending x 1"), None);
        assert_eq!(parse_pending("done"), None);
    }
}
