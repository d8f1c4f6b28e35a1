//! `throttle-worker dlq replay`: the matching dead letters written back to
//! the jobs topic, each exactly once, however often the replay is killed
//! and run again (see docs/src/internals/dlq-replay.md for why not Kafka transactions).
//!
//! A replayed record keeps its key, its value byte for byte (so its job id,
//! and the downstream's `Idempotency-Key`, stay the same) and its trace
//! headers; it gets `x-replayed-from: <dlq topic>:<partition>:<offset>` and
//! none of the worker's own headers, so it starts with fresh attempts and
//! is not taken for a retry-tier record.
//!
//! Exactly once: each dead letter has a marker in Redis (one hash per
//! dead-letter topic, [`KeySpace::dlq_replay`]). Before its copy is written
//! the marker says `pending <jobs partition> <offset>`, an offset at or
//! below the one the copy will get (the partition's high watermark read
//! before the marker), and after the broker acknowledged it `done`. A run
//! that finds `done` skips the record; one that finds `pending` (a run
//! killed between the two) reads that jobs partition from that offset for
//! a record replayed from this one, and writes it again only if there is
//! none. (A lookup by time would spare the watermark reads, but librdkafka's
//! mock cluster answers none, so it could not be tested.)
//!
//! Pipelined: up to [`ReplayOptions::in_flight`] copies are under way at
//! once, each with its own `pending` marker naming its own partition and
//! offset, so a killed run leaves at most that many to settle. The markers
//! of the dead letters read together are read in one call, and the pending
//! ones among them are settled with one read per jobs partition.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Copies under way at once unless `--in-flight` says otherwise: enough to
/// fill a produce batch within librdkafka's `linger.ms` (5 ms), few enough
/// that a killed run leaves a short read to settle.
pub const DEFAULT_IN_FLIGHT: usize = 64;

/// How long a jobs partition's high watermark serves as the offset of new
/// `pending` markers before it is read again. Any watermark read before a
/// marker is written is at or below its copy's offset (offsets only grow),
/// so reuse is sound; it only lengthens the read that settles a killed
/// run's markers by what the partition took meanwhile.
const WATERMARK_REUSE: Duration = Duration::from_millis(100);

/// How a replay runs.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// List what would go; write nothing, mark nothing.
    pub dry_run: bool,
    /// Replay records replayed before, too.
    pub again: bool,
    /// At most this many records a second.
    pub rate: Option<f64>,
    /// At most this many copies under way at once (at least 1): marked
    /// `pending`, not yet acknowledged.
    pub in_flight: usize,
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

/// Where the Kafka clients of a replay connect.
#[derive(Clone)]
struct Kafka {
    brokers: String,
    props: BTreeMap<String, String>,
    /// The jobs topic.
    jobs: String,
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
    let kafka = Kafka {
        brokers: settings.kafka.brokers.clone(),
        props: settings.kafka.consumer_config(),
        jobs: settings.kafka.topic.clone(),
    };
    let writer = Arc::new(Writer {
        store: RedisStore::open(&settings.redis).await?,
        markers: KeySpace::new(settings.redis.key_prefix.clone())
            .dlq_replay(&settings.kafka.dlq_topic),
        sink: RecordSink::new(&kafka.brokers, &settings.kafka.producer_config())?,
        jobs: kafka.jobs.clone(),
    });
    let watermarks = Watermarks::open(&kafka).await?;

    // The dead letters come from a reading thread, a few at a time; it
    // stops when this end is dropped (the replay failed).
    let (tx, rx) =
        tokio::sync::mpsc::channel::<(DeadLetter, ReadRecord)>(opts.in_flight.clamp(64, 1024));
    let reading = {
        let (k, t, f) = (
            kafka.clone(),
            settings.kafka.dlq_topic.clone(),
            filter.clone(),
        );
        tokio::task::spawn_blocking(move || {
            scan(
                &k.brokers,
                &k.props,
                &t,
                &f,
                false,
                &mut progress,
                |d, r| match tx.blocking_send((d, r)) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(_) => ControlFlow::Break(()),
                },
            )
        })
    };
    let mut run = Run {
        writer,
        kafka: &kafka,
        dlq: settings.kafka.dlq_topic.clone(),
        opts,
        watermarks,
        done: Replayed::default(),
    };
    let piped = run.pipeline(rx, out).await;
    // `rx` is gone: a reading thread still at work stops at its next
    // record instead of reading the rest of the topic for nothing.
    let read = reading
        .await
        .map_err(|e| DlqError::Write(format!("the reading thread failed: {e}")));
    piped?;
    read??;
    Ok(run.done)
}

/// Writes one copy: marker `pending`, the record, marker `done`.
struct Writer {
    store: RedisStore,
    /// The markers' hash ([`KeySpace::dlq_replay`]).
    markers: String,
    sink: RecordSink,
    jobs: String,
}

/// A dead letter to be written back.
struct Copy {
    /// Its marker's field: `<dlq partition>:<offset>`.
    field: String,
    /// `x-replayed-from`: `<dlq topic>:<partition>:<offset>`.
    from: String,
    /// The jobs partition it goes to.
    partition: i32,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    /// The kept trace headers.
    headers: Vec<(String, String)>,
}

impl Writer {
    /// `pending <partition> <low>` (`low` at or below the offset the copy
    /// will get), the record, then `done` once the broker acknowledged it.
    async fn write(&self, copy: Copy, low: i64) -> Result<(), DlqError> {
        let pending = format!("pending {} {low}", copy.partition);
        self.store
            .set_hash_field(&self.markers, &copy.field, &pending, MARKER_TTL)
            .await?;
        let mut headers: Vec<(&str, &[u8])> = copy
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        headers.push((X_REPLAYED_FROM, copy.from.as_bytes()));
        self.sink
            .produce_to(
                &self.jobs,
                copy.partition,
                copy.key.as_deref(),
                &copy.value,
                &headers,
            )
            .await?;
        self.store
            .set_hash_field(&self.markers, &copy.field, "done", MARKER_TTL)
            .await?;
        Ok(())
    }
}

/// The high watermarks of the jobs topic, from one reader kept open, each
/// reused for [`WATERMARK_REUSE`].
struct Watermarks {
    reader: Arc<Mutex<TopicReader>>,
    partitions: i32,
    /// Per partition: when its watermark was asked for, and the answer.
    read: HashMap<i32, (Instant, i64)>,
}

impl Watermarks {
    async fn open(kafka: &Kafka) -> Result<Watermarks, DlqError> {
        let k = kafka.clone();
        let reader =
            blocking(move || TopicReader::for_watermarks(&k.brokers, &k.props, &k.jobs)).await?;
        let reader = Arc::new(Mutex::new(reader));
        let partitions = {
            let reader = reader.clone();
            blocking(move || Ok(lock(&reader).watermarks()?.len() as i32)).await?
        };
        Ok(Watermarks {
            reader,
            partitions,
            read: HashMap::new(),
        })
    }

    /// An offset at or below the one the next record written to
    /// `partition` gets.
    async fn low(&mut self, partition: i32) -> Result<i64, DlqError> {
        if let Some((at, high)) = self.read.get(&partition) {
            if at.elapsed() < WATERMARK_REUSE {
                return Ok(*high);
            }
        }
        let asked = Instant::now();
        let reader = self.reader.clone();
        let high = blocking(move || lock(&reader).high_watermark(partition)).await?;
        self.read.insert(partition, (asked, high));
        Ok(high)
    }
}

/// One replay's state.
struct Run<'a> {
    writer: Arc<Writer>,
    kafka: &'a Kafka,
    dlq: String,
    opts: &'a ReplayOptions,
    watermarks: Watermarks,
    done: Replayed,
}

impl Run<'_> {
    /// Takes the dead letters from `rx` until it closes, and writes those
    /// to replay with up to `in_flight` under way, started no faster than
    /// `rate`. Returns at the first failure: the copies still under way
    /// are aborted with their `pending` markers, which the next run
    /// settles.
    ///
    /// Each copy is a task of its own, so that it goes on while this loop
    /// awaits something else (the next dead letters' markers, a
    /// watermark). As futures of this task they stalled then, and
    /// deadlocked it: a copy waiting for room in the Redis connection's
    /// request queue was handed the room but not polled to use it, and
    /// the markers' read queued behind it waited forever (seen with 128
    /// and 256 under way).
    async fn pipeline(
        &mut self,
        mut rx: tokio::sync::mpsc::Receiver<(DeadLetter, ReadRecord)>,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<(), DlqError> {
        let in_flight = self.opts.in_flight.max(1);
        let pause = self
            .opts
            .rate
            .filter(|r| *r > 0.0)
            .map(|r| Duration::from_secs_f64(1.0 / r));
        let mut under_way = tokio::task::JoinSet::new();
        let mut ready: VecDeque<Copy> = VecDeque::new();
        let mut closed = false;
        let mut next_start = tokio::time::Instant::now();
        loop {
            let take = ready.is_empty() && !closed;
            let start = !ready.is_empty() && under_way.len() < in_flight;
            if !take && !start && under_way.is_empty() {
                return Ok(());
            }
            tokio::select! {
                // Acknowledgements first: they free room for more.
                biased;
                Some(written) = under_way.join_next(), if !under_way.is_empty() => {
                    written.map_err(|e| DlqError::Write(format!("a copy's task failed: {e}")))??;
                    self.done.replayed += 1;
                }
                _ = tokio::time::sleep_until(next_start), if start => {
                    let copy = ready.pop_front().expect("start only with a copy ready");
                    let low = self.watermarks.low(copy.partition).await?;
                    let writer = self.writer.clone();
                    under_way.spawn(async move { writer.write(copy, low).await });
                    if let Some(p) = pause {
                        next_start = tokio::time::Instant::now() + p;
                    }
                }
                first = rx.recv(), if take => match first {
                    None => closed = true,
                    Some(first) => {
                        let mut batch = vec![first];
                        while batch.len() < in_flight {
                            match rx.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                        ready.extend(self.triage(batch, out).await?);
                    }
                },
            }
        }
    }

    /// Sorts dead letters read together by their markers: replayed before
    /// (skipped), written by a killed run (found in the jobs topic: marked
    /// done and skipped), and the rest, returned to be written (with
    /// `--dry-run`: listed).
    async fn triage(
        &mut self,
        batch: Vec<(DeadLetter, ReadRecord)>,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<Vec<Copy>, DlqError> {
        self.done.matched += batch.len() as u64;
        let fields: Vec<String> = batch
            .iter()
            .map(|(_, r)| format!("{}:{}", r.partition, r.offset))
            .collect();
        let marks = if self.opts.again {
            vec![None; batch.len()]
        } else {
            let w = &self.writer;
            w.store.hash_fields(&w.markers, &fields).await?
        };
        let from = |r: &ReadRecord| format!("{}:{}:{}", self.dlq, r.partition, r.offset);
        // The pending ones, by the jobs partition and offset they name.
        let mut pending: BTreeMap<i32, (i64, HashSet<String>)> = BTreeMap::new();
        for ((_, r), mark) in batch.iter().zip(&marks) {
            if let Some((partition, offset)) = mark.as_deref().and_then(parse_pending) {
                let entry = pending.entry(partition).or_insert((offset, HashSet::new()));
                entry.0 = entry.0.min(offset);
                entry.1.insert(from(r));
            }
        }
        let mut found = HashSet::new();
        for (partition, (start, wanted)) in pending {
            let k = self.kafka.clone();
            found.extend(
                blocking(move || written(&k.brokers, &k.props, &k.jobs, partition, start, wanted))
                    .await?,
            );
        }
        let mut copies = Vec::new();
        for (((d, r), mark), field) in batch.into_iter().zip(marks).zip(fields) {
            let from = from(&r);
            if mark.as_deref() == Some("done") {
                self.done.already += 1;
                continue;
            }
            if found.contains(&from) {
                if !self.opts.dry_run {
                    let w = &self.writer;
                    w.store
                        .set_hash_field(&w.markers, &field, "done", MARKER_TTL)
                        .await?;
                }
                self.done.recovered += 1;
                continue;
            }
            if self.opts.dry_run {
                match self.opts.output {
                    crate::operator::Output::Table => writeln!(out, "{}", line(&d))?,
                    crate::operator::Output::Json => {
                        writeln!(out, "{}", serde_json::to_string(&d).unwrap_or_default())?
                    }
                }
                self.done.replayed += 1;
                continue;
            }
            let partition = target_partition(&d, &r, &self.kafka.jobs, self.watermarks.partitions);
            copies.push(Copy {
                field,
                from,
                partition,
                headers: r
                    .headers
                    .iter()
                    .filter(|(k, _)| KEPT_HEADERS.contains(&k.as_str()))
                    .cloned()
                    .collect(),
                key: r.key,
                value: r.value.unwrap_or_default(),
            });
        }
        Ok(copies)
    }
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
    let mut parts = marker.strip_prefix("pending ")?.split_whitespace();
    let partition = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    Some((partition, offset))
}

fn lock(reader: &Mutex<TopicReader>) -> std::sync::MutexGuard<'_, TopicReader> {
    // A reader holds no invariant a panic elsewhere could break.
    reader.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which of `wanted` (`x-replayed-from` values) `partition` of `topic`
/// holds a record replayed from, between `start` and its end now.
fn written(
    brokers: &str,
    props: &BTreeMap<String, String>,
    topic: &str,
    partition: i32,
    start: i64,
    mut wanted: HashSet<String>,
) -> Result<HashSet<String>, ReaderError> {
    let mut found = HashSet::new();
    let mut reader = TopicReader::open_partition(brokers, props, topic, partition, start)?;
    let end = reader.end_offsets()?;
    let ends: BTreeMap<i32, i64> = end.into_iter().filter(|(p, _)| *p == partition).collect();
    if ends.get(&partition).is_none_or(|e| *e <= start) {
        return Ok(found);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reader.reached(&ends) && !wanted.is_empty() {
        if Instant::now() >= deadline {
            return Err(ReaderError::Timeout {
                topic: topic.to_owned(),
                ends,
                read_to: reader.read_to().clone(),
                timeout: Duration::from_secs(30),
            });
        }
        for r in reader.poll(Duration::from_millis(100))? {
            if let Some(from) = r.header(X_REPLAYED_FROM) {
                if let Some(from) = wanted.take(from) {
                    found.insert(from);
                }
            }
        }
    }
    Ok(found)
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
