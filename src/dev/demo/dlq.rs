//! The dead-letter topic, followed from its beginning on a thread of its
//! own (the Kafka reader blocks): counts per seller and reason for the live
//! view, and at the end every dead letter's job id, read to the topic's end.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::kafka::{ReadRecord, ReaderError, TopicReader};

/// `x-error` is up to 1 KiB; the summary groups and shows this much.
const REASON_CHARS: usize = 90;

/// What the dead-letter topic held, as far as it was read.
#[derive(Debug, Clone, Default)]
pub struct DeadLetters {
    pub total: usize,
    /// By the seller of the record key (`?` without one).
    pub by_seller: BTreeMap<String, usize>,
    /// By `x-error`, cut to [`REASON_CHARS`].
    pub by_reason: BTreeMap<String, usize>,
    /// Dead letters per job id (from the key).
    pub job_ids: HashMap<String, usize>,
}

impl DeadLetters {
    fn absorb(&mut self, records: &[ReadRecord]) {
        for r in records {
            self.total += 1;
            let (seller, job) = r
                .key
                .as_deref()
                .and_then(crate::dev::load::parse_key)
                .unwrap_or(("?", ""));
            *self.by_seller.entry(seller.to_owned()).or_default() += 1;
            if !job.is_empty() {
                *self.job_ids.entry(job.to_owned()).or_default() += 1;
            }
            let reason: String = r
                .header(crate::kafka::producer::X_ERROR)
                .unwrap_or("(no x-error header)")
                .chars()
                .take(REASON_CHARS)
                .collect();
            *self.by_reason.entry(reason).or_default() += 1;
        }
    }

    /// The counts without the job ids, for the live view.
    fn counts(&self) -> DeadLetters {
        DeadLetters {
            total: self.total,
            by_seller: self.by_seller.clone(),
            by_reason: self.by_reason.clone(),
            job_ids: HashMap::new(),
        }
    }
}

/// Why [`DlqTail::finish`] could not read the topic to its end. The
/// transparent variants say only what their cause says: the caller adds
/// what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// The blocking task that joins the thread did not run to its end.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    #[error("the dead-letter reader panicked")]
    Panicked,
    #[error(transparent)]
    Read(#[from] ReaderError),
}

/// The following thread.
pub struct DlqTail {
    seen: Arc<Mutex<DeadLetters>>,
    finish: mpsc::Sender<Duration>,
    thread: JoinHandle<Result<(), ReaderError>>,
}

impl DlqTail {
    /// Opens the topic (failing here if it cannot) and follows it.
    pub fn start(
        brokers: &str,
        properties: &BTreeMap<String, String>,
        topic: &str,
    ) -> Result<DlqTail, ReaderError> {
        let mut reader = TopicReader::open(brokers, properties, topic)?;
        let seen = Arc::new(Mutex::new(DeadLetters::default()));
        let (finish, finish_rx) = mpsc::channel::<Duration>();
        let shared = seen.clone();
        let thread = std::thread::Builder::new()
            .name("demo-dlq".into())
            .spawn(move || loop {
                match finish_rx.try_recv() {
                    Ok(timeout) => {
                        let ends = reader.end_offsets()?;
                        let records = reader.read_to_end(&ends, timeout)?;
                        lock(&shared).absorb(&records);
                        return Ok(());
                    }
                    Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
                    Err(mpsc::TryRecvError::Empty) => {
                        let records = reader.poll(Duration::from_millis(200))?;
                        lock(&shared).absorb(&records);
                    }
                }
            })
            .expect("spawn the dead-letter thread");
        Ok(DlqTail {
            seen,
            finish,
            thread,
        })
    }

    /// The counts so far.
    pub fn counts(&self) -> DeadLetters {
        lock(&self.seen).counts()
    }

    /// Reads the topic to its end as of now (within `timeout`) and returns
    /// everything it held.
    pub async fn finish(self, timeout: Duration) -> Result<DeadLetters, FinishError> {
        // A send fails only if the thread already ended, with an error
        // that join reports.
        let _ = self.finish.send(timeout);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| FinishError::Panicked)??;
        Ok(std::mem::take(&mut *lock(&self.seen)))
    }
}

fn lock(m: &Mutex<DeadLetters>) -> std::sync::MutexGuard<'_, DeadLetters> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
