//! Dead letters as an operator sees them: `throttle-worker dlq stats` counts
//! the records of the dead-letter topic by reason kind, seller and age,
//! `dlq show` lists them, and `dlq replay` ([`replay`]) writes them back to
//! the jobs topic, each exactly once. Both read the topic from its beginning outside
//! any consumer group (reading never rebalances the workers) and keep only
//! the records a [`Filter`] matches.
//!
//! What a dead letter says of itself is in its headers (see
//! [`crate::kafka::producer`]): why (`x-error`, and its kind in
//! `x-error-kind`), whose (`x-seller-id`, `x-job-id`), from where
//! (`x-original-*`). A record written by a version before the kind header
//! has the kind `unknown`, and names its seller and job only in its value:
//! the value is read for them and dropped. Payloads are shown only when
//! asked for.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::kafka::producer::{
    X_ATTEMPTS, X_ERROR, X_ERROR_KIND, X_JOB_ID, X_ORIGINAL_OFFSET, X_ORIGINAL_PARTITION,
    X_ORIGINAL_TOPIC, X_SELLER_ID,
};
use crate::kafka::{ReadRecord, ReaderError, TopicReader};

pub mod replay;

pub use replay::{replay, ReplayOptions, Replayed};

/// The kind of a dead letter that names none (written before kinds were).
pub const UNKNOWN_KIND: &str = crate::dead_letter::DeadLetterKind::Unknown.name();

/// One dead letter, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its place in the dead-letter topic.
    pub partition: i32,
    pub offset: i64,
    /// When it was written (the record's timestamp), Unix ms.
    pub timestamp_ms: Option<i64>,
    /// `attempts_exhausted`, `not_json`, ... (the `kind` label of
    /// `throttle_jobs_dead_lettered_total`), or [`UNKNOWN_KIND`].
    pub kind: String,
    pub reason: String,
    pub seller: Option<String>,
    pub job_id: Option<String>,
    /// Where the job first entered (the jobs topic's coordinates).
    pub original: Option<Original>,
    pub attempts: Option<u32>,
    pub value_bytes: usize,
    /// The value (lossy UTF-8), only when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// A dead letter's first position, from its `x-original-*` headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Original {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// The ids in a job's value, for dead letters without the id headers.
#[derive(Deserialize)]
struct Ids {
    job_id: Option<String>,
    seller_id: Option<String>,
}

impl DeadLetter {
    /// Reads a record of the dead-letter topic; `value` is the record's
    /// value when the reader kept it.
    pub fn from_record(r: &ReadRecord, keep_payload: bool) -> DeadLetter {
        let header = |name: &str| r.header(name).map(str::to_owned);
        let number = |name: &str| r.header(name).and_then(|v| v.trim().parse::<i64>().ok());
        let original = match (
            header(X_ORIGINAL_TOPIC),
            number(X_ORIGINAL_PARTITION),
            number(X_ORIGINAL_OFFSET),
        ) {
            (Some(topic), Some(partition), Some(offset)) => Some(Original {
                topic,
                partition: partition as i32,
                offset,
            }),
            _ => None,
        };
        let (mut seller, mut job_id) = (header(X_SELLER_ID), header(X_JOB_ID));
        if seller.is_none() || job_id.is_none() {
            // An older dead letter: the ids are only in the value, if it is
            // a job at all.
            if let Some(ids) = r
                .value
                .as_deref()
                .and_then(|v| serde_json::from_slice::<Ids>(v).ok())
            {
                seller = seller.or(ids.seller_id);
                job_id = job_id.or(ids.job_id);
            }
        }
        DeadLetter {
            partition: r.partition,
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            kind: header(X_ERROR_KIND).unwrap_or_else(|| UNKNOWN_KIND.to_owned()),
            reason: header(X_ERROR).unwrap_or_default(),
            seller,
            job_id,
            original,
            attempts: number(X_ATTEMPTS).and_then(|a| u32::try_from(a).ok()),
            value_bytes: r.value_len,
            payload: keep_payload
                .then(|| {
                    r.value
                        .as_deref()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
                .flatten(),
        }
    }
}

/// Which dead letters a command takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Any of these kinds (none: every kind).
    pub kinds: Vec<String>,
    pub seller: Option<String>,
    /// Written at or after this instant (Unix ms).
    pub after_ms: Option<i64>,
    /// Written before this instant (Unix ms).
    pub before_ms: Option<i64>,
    /// At most this many (in the topic's order per partition).
    pub limit: Option<usize>,
}

impl Filter {
    pub fn matches(&self, d: &DeadLetter) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&d.kind))
            && self
                .seller
                .as_ref()
                .is_none_or(|s| d.seller.as_deref() == Some(s.as_str()))
            && self
                .after_ms
                .is_none_or(|t| d.timestamp_ms.is_some_and(|ts| ts >= t))
            && self
                .before_ms
                .is_none_or(|t| d.timestamp_ms.is_some_and(|ts| ts < t))
    }
}

/// Age buckets of `dlq stats`: upper bound in ms and label.
const AGES: [(i64, &str); 5] = [
    (3_600_000, "< 1h"),
    (86_400_000, "1h - 1d"),
    (7 * 86_400_000, "1d - 7d"),
    (30 * 86_400_000, "7d - 30d"),
    (i64::MAX, ">= 30d"),
];

/// Where a dead letter sits and when it was written: the oldest and newest
/// of `dlq stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mark {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: i64,
    pub kind: String,
    pub seller: Option<String>,
}

/// Counts of the matching dead letters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub total: u64,
    pub by_kind: BTreeMap<String, u64>,
    /// Records without a seller (not a job) count under `""`.
    pub by_seller: BTreeMap<String, u64>,
    /// By age at `now`, in the buckets of [`AGES`] (empty buckets left out).
    pub by_age: BTreeMap<String, u64>,
    pub oldest: Option<Mark>,
    pub newest: Option<Mark>,
}

impl Stats {
    pub fn add(&mut self, d: &DeadLetter, now_ms: i64) {
        self.total += 1;
        *self.by_kind.entry(d.kind.clone()).or_default() += 1;
        *self
            .by_seller
            .entry(d.seller.clone().unwrap_or_default())
            .or_default() += 1;
        let Some(ts) = d.timestamp_ms else {
            return;
        };
        let age = now_ms.saturating_sub(ts).max(0);
        let label = AGES
            .iter()
            .find(|(upper, _)| age < *upper)
            .map_or(AGES[AGES.len() - 1].1, |(_, l)| l);
        *self.by_age.entry(label.to_owned()).or_default() += 1;
        let mark = || Mark {
            partition: d.partition,
            offset: d.offset,
            timestamp_ms: ts,
            kind: d.kind.clone(),
            seller: d.seller.clone(),
        };
        if self.oldest.as_ref().is_none_or(|m| ts < m.timestamp_ms) {
            self.oldest = Some(mark());
        }
        if self.newest.as_ref().is_none_or(|m| ts >= m.timestamp_ms) {
            self.newest = Some(mark());
        }
    }

    /// The table `dlq stats` prints: kinds and ages in full, the
    /// `top_sellers` sellers with the most dead letters.
    pub fn table(&self, top_sellers: usize) -> String {
        let mut s = format!("{} dead letters\n", self.total);
        if self.total == 0 {
            return s;
        }
        let mut kinds: Vec<(String, u64)> =
            self.by_kind.iter().map(|(k, n)| (k.clone(), *n)).collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        section(&mut s, "by kind", &kinds);
        let mut sellers: Vec<(String, u64)> = self
            .by_seller
            .iter()
            .map(|(k, n)| {
                let name = if k.is_empty() { "(not a job)" } else { k };
                (name.to_owned(), *n)
            })
            .collect();
        sellers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let more = sellers.len().saturating_sub(top_sellers);
        sellers.truncate(top_sellers);
        let title = format!("by seller (the {top_sellers} with the most)");
        section(&mut s, &title, &sellers);
        if more > 0 {
            s.push_str(&format!("  ({more} more sellers)\n"));
        }
        let ages: Vec<(String, u64)> = AGES
            .iter()
            .filter_map(|(_, l)| self.by_age.get(*l).map(|n| ((*l).to_owned(), *n)))
            .collect();
        section(&mut s, "by age", &ages);
        s.push('\n');
        for (what, m) in [("oldest", &self.oldest), ("newest", &self.newest)] {
            if let Some(m) = m {
                s.push_str(&format!(
                    "{what}: {} (partition {}, offset {}, {}{})\n",
                    rfc3339(m.timestamp_ms),
                    m.partition,
                    m.offset,
                    m.kind,
                    m.seller
                        .as_ref()
                        .map_or(String::new(), |s| format!(", seller {s}"))
                ));
            }
        }
        s
    }
}

/// A titled block of `(name, count)` rows, the counts aligned.
fn section(s: &mut String, title: &str, rows: &[(String, u64)]) {
    s.push_str(&format!("\n{title}\n"));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, n) in rows {
        s.push_str(&format!("  {k:<width$}  {n:>8}\n"));
    }
}

/// One line of `dlq show`.
pub fn line(d: &DeadLetter) -> String {
    let when = d.timestamp_ms.map_or("-".to_owned(), rfc3339);
    let original = d.original.as_ref().map_or("-".to_owned(), |o| {
        format!("{}[{}]@{}", o.topic, o.partition, o.offset)
    });
    let mut s = format!(
        "{when}  dlq[{}]@{}  {}  seller={}  job={}  from {original}  attempts={}  {}",
        d.partition,
        d.offset,
        d.kind,
        d.seller.as_deref().unwrap_or("-"),
        d.job_id.as_deref().unwrap_or("-"),
        d.attempts.map_or("-".to_owned(), |a| a.to_string()),
        d.reason,
    );
    if let Some(p) = &d.payload {
        s.push_str(&format!("\n    payload ({} bytes): {p}", d.value_bytes));
    }
    s
}

fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// How far a read of the topic has come: records read of the total.
pub trait Progress {
    fn total(&mut self, records: u64);
    fn read(&mut self, records: u64);
    fn done(&mut self);
}

/// No progress shown.
impl Progress for () {
    fn total(&mut self, _: u64) {}
    fn read(&mut self, _: u64) {}
    fn done(&mut self) {}
}

/// How long a read may go without a record before it gives up, naming
/// the partitions it did not read to their end (a broker gone, say).
const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the dead-letter `topic` from its beginning to its end as it is
/// now, and hands each dead letter `filter` matches to `visit`, up to the
/// filter's limit or until `visit` breaks (its consumer is gone: reading
/// on would be for nothing). Returns how many `visit` took. Blocking: run
/// it on a thread of its own.
pub fn scan(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    topic: &str,
    filter: &Filter,
    keep_payload: bool,
    progress: &mut dyn Progress,
    mut visit: impl FnMut(DeadLetter, ReadRecord) -> ControlFlow<()>,
) -> Result<u64, ReaderError> {
    let mut reader = TopicReader::open(brokers, properties, topic)?.keep_values();
    let marks = reader.watermarks()?;
    // A partition with nothing left to read (empty, or emptied by
    // retention) has no end to reach.
    let ends: BTreeMap<i32, i64> = marks
        .iter()
        .filter(|(_, (low, high))| high > low)
        .map(|(p, (_, high))| (*p, *high))
        .collect();
    progress.total(
        marks
            .values()
            .map(|(low, high)| (high - low).max(0) as u64)
            .sum(),
    );
    let mut taken = 0u64;
    let limit = filter.limit.map_or(u64::MAX, |l| l as u64);
    let mut last_read = Instant::now();
    while !reader.reached(&ends) && taken < limit {
        let batch = reader.poll(Duration::from_millis(100))?;
        if batch.is_empty() {
            if last_read.elapsed() >= STALL_TIMEOUT {
                return Err(ReaderError::Timeout {
                    topic: topic.to_owned(),
                    ends,
                    read_to: reader.read_to().clone(),
                    timeout: STALL_TIMEOUT,
                });
            }
        } else {
            last_read = Instant::now();
        }
        progress.read(batch.len() as u64);
        for r in batch {
            // Records written after the scan began are not part of it.
            if ends.get(&r.partition).is_none_or(|end| r.offset >= *end) {
                continue;
            }
            let d = DeadLetter::from_record(&r, keep_payload);
            if taken < limit && filter.matches(&d) {
                taken += 1;
                if visit(d, r).is_break() {
                    progress.done();
                    return Ok(taken);
                }
            }
        }
    }
    progress.done();
    Ok(taken)
}

/// Why a `dlq` command could not run.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error(
        "--{flag} {value:?}: neither an RFC 3339 time (2026-11-23T18:00:00Z) nor an age (2h, 30m)"
    )]
    BadTime { flag: &'static str, value: String },
    #[error("--limit 0 takes nothing; give at least 1")]
    ZeroLimit,
    #[error(transparent)]
    Read(#[from] ReaderError),
    #[error("could not write the output: {0}")]
    Output(#[from] std::io::Error),
    #[error("replay markers in Redis: {0}")]
    Markers(String),
    #[error("could not write a replayed record: {0}")]
    Write(String),
}

/// `--after`/`--before`: an RFC 3339 time, or an age before `now_ms`.
pub fn parse_when(flag: &'static str, value: &str, now_ms: i64) -> Result<i64, DlqError> {
    let bad = || DlqError::BadTime {
        flag,
        value: value.to_owned(),
    };
    if let Ok(t) = humantime::parse_rfc3339_weak(value.trim()) {
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| bad())?
            .as_millis();
        return i64::try_from(ms).map_err(|_| bad());
    }
    let age = humantime::parse_duration(value.trim()).map_err(|_| bad())?;
    let age = i64::try_from(age.as_millis()).map_err(|_| bad())?;
    Ok(now_ms.saturating_sub(age))
}

impl Filter {
    /// The filter of a command line's `--kind`, `--seller`, `--after`,
    /// `--before` and `--limit` (as [`crate::cli::DlqSelect`] holds them),
    /// ages taken before `now_ms`. A time comes with the name of the flag
    /// that gave it (`after`, or the deprecated `since`), for its error.
    pub fn from_args(
        kinds: Vec<String>,
        seller: Option<String>,
        after: Option<(&'static str, &str)>,
        before: Option<(&'static str, &str)>,
        limit: Option<usize>,
        now_ms: i64,
    ) -> Result<Filter, DlqError> {
        if limit == Some(0) {
            return Err(DlqError::ZeroLimit);
        }
        Ok(Filter {
            kinds,
            seller,
            after_ms: after
                .map(|(flag, v)| parse_when(flag, v, now_ms))
                .transpose()?,
            before_ms: before
                .map(|(flag, v)| parse_when(flag, v, now_ms))
                .transpose()?,
            limit,
        })
    }
}

/// A progress bar on stderr while a read goes through the topic; drawn
/// only on a terminal.
pub struct TerminalProgress(indicatif::ProgressBar);

impl TerminalProgress {
    pub fn new(what: &str) -> TerminalProgress {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {pos}/{len} records ({per_sec}, {eta} left)",
        ) {
            bar.set_style(style);
        }
        bar.set_message(what.to_owned());
        TerminalProgress(bar)
    }
}

impl Progress for TerminalProgress {
    fn total(&mut self, records: u64) {
        self.0.set_length(records);
    }
    fn read(&mut self, records: u64) {
        self.0.inc(records);
    }
    fn done(&mut self) {
        self.0.finish_and_clear();
    }
}

/// `dlq stats`: the counts of the matching dead letters in `kafka`'s
/// dead-letter topic, as a table or JSON.
pub fn stats(
    kafka: &crate::config::KafkaSettings,
    filter: &Filter,
    top_sellers: usize,
    output: crate::operator::Output,
    now_ms: i64,
    progress: &mut dyn Progress,
) -> Result<String, DlqError> {
    let mut stats = Stats::default();
    scan(
        &kafka.brokers,
        &kafka.properties,
        &kafka.dlq_topic,
        filter,
        false,
        progress,
        |d, _| {
            stats.add(&d, now_ms);
            ControlFlow::Continue(())
        },
    )?;
    Ok(match output {
        crate::operator::Output::Table => {
            format!("{}: {}", kafka.dlq_topic, stats.table(top_sellers))
        }
        crate::operator::Output::Json => {
            let mut v = serde_json::to_value(&stats).unwrap_or_default();
            v["topic"] = serde_json::Value::from(kafka.dlq_topic.clone());
            format!("{v:#}\n")
        }
    })
}

/// `dlq show`: the matching dead letters written to `out` as they are
/// read, one a line (JSON Lines with `Output::Json`). Returns how many.
pub fn show(
    kafka: &crate::config::KafkaSettings,
    filter: &Filter,
    payload: bool,
    output: crate::operator::Output,
    progress: &mut dyn Progress,
    out: &mut dyn std::io::Write,
) -> Result<u64, DlqError> {
    let mut failed: Option<std::io::Error> = None;
    let n = scan(
        &kafka.brokers,
        &kafka.properties,
        &kafka.dlq_topic,
        filter,
        payload,
        progress,
        |d, _| {
            let text = match output {
                crate::operator::Output::Table => line(&d),
                crate::operator::Output::Json => serde_json::to_string(&d).unwrap_or_default(),
            };
            match writeln!(out, "{text}") {
                Ok(()) => ControlFlow::Continue(()),
                // A closed pipe (`| head`): stop reading.
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            }
        },
    )?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &str)], value: &[u8], ts: i64) -> ReadRecord {
        ReadRecord {
            partition: 1,
            offset: 7,
            timestamp_ms: Some(ts),
            key: None,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value_len: value.len(),
            value: Some(value.to_vec()),
        }
    }

    /// Regression: when `dlq replay` failed, its reading thread's sends
    /// failed unseen and it read the rest of the topic for nobody. A visit
    /// that breaks ends the scan there.
    #[cfg(feature = "dev-tools")] // the mock broker
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_visit_that_breaks_ends_the_scan() {
        use crate::kafka::{DevBroker, RecordSink};
        let topic = "dlq-break";
        let broker = DevBroker::start(&[(topic.to_owned(), 1)]).unwrap();
        let sink = RecordSink::new(broker.bootstrap_servers(), &BTreeMap::new()).unwrap();
        for i in 0..20 {
            sink.produce(topic, format!("k{i}").as_bytes(), b"{}")
                .await
                .unwrap();
        }
        let bootstrap = broker.bootstrap_servers().to_owned();
        let (taken, seen) = tokio::task::spawn_blocking(move || {
            let mut seen = 0;
            let taken = scan(
                &bootstrap,
                &BTreeMap::new(),
                topic,
                &Filter::default(),
                false,
                &mut (),
                |_, _| {
                    seen += 1;
                    if seen == 3 {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )
            .unwrap();
            (taken, seen)
        })
        .await
        .unwrap();
        assert_eq!((taken, seen), (3, 3), "(returned, visits) of 20 records");
    }

    #[test]
    fn a_dead_letter_reads_its_headers_and_falls_back_to_the_value() {
        let new = record(
            &[
                (X_ERROR, "downstream failed 5 times"),
                (X_ERROR_KIND, "attempts_exhausted"),
                (X_SELLER_ID, "s-1"),
                (X_JOB_ID, "j-1"),
                (X_ATTEMPTS, "5"),
                (X_ORIGINAL_TOPIC, "jobs"),
                (X_ORIGINAL_PARTITION, "3"),
                (X_ORIGINAL_OFFSET, "42"),
            ],
            br#"{"job_id":"other","seller_id":"other","payload":{}}"#,
            1_000,
        );
        let d = DeadLetter::from_record(&new, false);
        assert_eq!(d.kind, "attempts_exhausted");
        assert_eq!(d.seller.as_deref(), Some("s-1"), "the header wins");
        assert_eq!(d.job_id.as_deref(), Some("j-1"));
        assert_eq!(d.attempts, Some(5));
        assert_eq!(
            d.original,
            Some(Original {
                topic: "jobs".into(),
                partition: 3,
                offset: 42
            })
        );
        assert_eq!(d.payload, None, "no payload unless asked for");

        // Written before the kind and id headers: ids from the value.
        let old = record(
            &[(X_ERROR, "downstream failed")],
            br#"{"job_id":"j-2","seller_id":"s-2","payload":{"sku":"x"}}"#,
            2_000,
        );
        let d = DeadLetter::from_record(&old, true);
        assert_eq!(d.kind, UNKNOWN_KIND);
        assert_eq!(d.seller.as_deref(), Some("s-2"));
        assert_eq!(d.job_id.as_deref(), Some("j-2"));
        assert!(d.payload.as_deref().unwrap().contains("\"sku\""));

        // Not a job at all.
        let junk = record(&[(X_ERROR_KIND, "not_json")], b"\xff garbage", 3_000);
        let d = DeadLetter::from_record(&junk, false);
        assert_eq!((d.seller, d.job_id), (None, None));
    }

    #[test]
    fn the_filter_takes_kind_seller_and_time() {
        let d = DeadLetter::from_record(
            &record(
                &[(X_ERROR_KIND, "attempts_exhausted"), (X_SELLER_ID, "s-1")],
                b"",
                5_000,
            ),
            false,
        );
        let f = |kinds: &[&str], seller: Option<&str>, since, until| Filter {
            kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
            seller: seller.map(str::to_owned),
            after_ms: since,
            before_ms: until,
            limit: None,
        };
        assert!(f(&[], None, None, None).matches(&d));
        assert!(f(&["not_json", "attempts_exhausted"], Some("s-1"), None, None).matches(&d));
        assert!(!f(&["not_json"], None, None, None).matches(&d));
        assert!(!f(&[], Some("s-2"), None, None).matches(&d));
        assert!(
            f(&[], None, Some(5_000), Some(5_001)).matches(&d),
            "since is inclusive"
        );
        assert!(!f(&[], None, Some(5_001), None).matches(&d));
        assert!(
            !f(&[], None, None, Some(5_000)).matches(&d),
            "until is exclusive"
        );
    }

    #[test]
    fn stats_count_by_kind_seller_and_age_with_the_oldest_and_newest() {
        let hour = 3_600_000;
        let now = 100 * 86_400_000;
        let mut stats = Stats::default();
        for (kind, seller, age) in [
            ("attempts_exhausted", Some("a"), 10),
            ("attempts_exhausted", Some("b"), 2 * hour),
            ("not_json", None, 3 * 86_400_000),
            ("attempts_exhausted", Some("a"), 40 * 86_400_000),
        ] {
            let mut headers = vec![(X_ERROR_KIND, kind)];
            if let Some(s) = seller {
                headers.push((X_SELLER_ID, s));
            }
            stats.add(
                &DeadLetter::from_record(&record(&headers, b"", now - age), false),
                now,
            );
        }
        assert_eq!(stats.total, 4);
        assert_eq!(stats.by_kind["attempts_exhausted"], 3);
        assert_eq!(stats.by_kind["not_json"], 1);
        assert_eq!(stats.by_seller["a"], 2);
        assert_eq!(stats.by_seller[""], 1, "not a job");
        assert_eq!(stats.by_age["< 1h"], 1);
        assert_eq!(stats.by_age["1h - 1d"], 1);
        assert_eq!(stats.by_age["1d - 7d"], 1);
        assert_eq!(stats.by_age[">= 30d"], 1);
        assert_eq!(
            stats.oldest.as_ref().unwrap().timestamp_ms,
            now - 40 * 86_400_000
        );
        assert_eq!(stats.newest.as_ref().unwrap().timestamp_ms, now - 10);
        let table = stats.table(1);
        assert!(table.contains("4 dead letters"), "{table}");
        assert!(table.contains("(2 more sellers)"), "{table}");
    }
}
