//! The poll thread: every call into librdkafka that can block runs there,
//! never on the async runtime's threads. It polls, tracks and hands over
//! records, runs the rebalance callbacks (inside the poll) and the commits
//! asked of it. [`PollThread`] is the consumer's side: the thread, its
//! command channel and the flags the two share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::Consumer as _;
use rdkafka::message::Message;
use tokio::sync::{mpsc, oneshot};

use super::commits::CommitQueue;
use crate::kafka::producer::{header_pairs, OriginalRecord, RetryHeaders};
use crate::kafka::record::{Origin, Record};
use crate::kafka::session::Received;
use crate::telemetry::events::KafkaPollFailed;

use super::context::Broker;
use super::WorkerConsumer;
use super::{lock_opt, ConsumerError, SharedSession};

/// How long one poll waits for a record; also the longest a commit asked of
/// the poll thread waits to start when no record arrives.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);

/// How often the watchdog tells the session the process is alive: far
/// below any session timeout, and the longest a stop waits for it.
const ALIVE_EVERY: Duration = Duration::from_millis(100);

/// Work the poll thread does between polls.
enum Command {
    /// Commit the finished prefix: of every partition that moved since the
    /// last commit, or (`all`) of every partition with a committable offset.
    Commit {
        all: bool,
        reply: Option<oneshot::Sender<Result<usize, ConsumerError>>>,
    },
    /// Commit where every partition with a record stands, nothing finished
    /// included (`Session::commit_start`), and answer.
    Start {
        reply: oneshot::Sender<Result<usize, ConsumerError>>,
    },
}

/// The consumer's handle on its poll thread.
pub(super) struct PollThread {
    commands: std_mpsc::Sender<Command>,
    /// Taken by [`PollThread::start`].
    commands_rx: Mutex<Option<std_mpsc::Receiver<Command>>>,
    /// A periodic commit is queued and not yet done: do not queue another.
    commit_queued: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The session's watchdog (see [`watch`]).
    watchdog: Mutex<Option<JoinHandle<()>>>,
}

impl PollThread {
    /// Not started yet: see [`PollThread::start`].
    pub(super) fn new() -> PollThread {
        let (commands, commands_rx) = std_mpsc::channel();
        PollThread {
            commands,
            commands_rx: Mutex::new(Some(commands_rx)),
            commit_queued: Arc::default(),
            stop: Arc::default(),
            thread: Mutex::new(None),
            watchdog: Mutex::new(None),
        }
    }

    /// Starts the thread, which polls `inner`, tracks what it receives in
    /// `session` and delivers it into `records`. Call once.
    pub(super) fn start(
        &self,
        inner: Arc<WorkerConsumer>,
        session: SharedSession,
        records: mpsc::Sender<Record>,
        ordering_header: Option<Arc<str>>,
    ) -> Result<(), ConsumerError> {
        let commands = lock_opt(&self.commands_rx)
            .take()
            .ok_or(ConsumerError::Stopped)?;
        let role = inner.context().role();
        let watchdog = {
            let (session, stop) = (session.clone(), self.stop.clone());
            std::thread::Builder::new()
                .name(format!("kafka-watch-{}", role.as_str()))
                .spawn(move || watch(&session, &stop))
                .map_err(ConsumerError::Spawn)?
        };
        *lock_opt(&self.watchdog) = Some(watchdog);
        let poller = Poller {
            inner: inner.clone(),
            session,
            records,
            commands,
            commit_queued: self.commit_queued.clone(),
            stop: self.stop.clone(),
            answers: CommitQueue::new(inner),
            ordering_header,
        };
        let handle = std::thread::Builder::new()
            .name(format!("kafka-poll-{}", role.as_str()))
            .spawn(move || poller.run())
            .map_err(ConsumerError::Spawn)?;
        *lock_opt(&self.thread) = Some(handle);
        Ok(())
    }

    /// Asks the poll thread for a commit of every partition that moved since
    /// the last one; returns at once. Done, failed (counted and logged) and
    /// acknowledged by the broker on that thread.
    pub(super) fn request_commit(&self) {
        if self.commit_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        if self
            .commands
            .send(Command::Commit {
                all: false,
                reply: None,
            })
            .is_err()
        {
            self.commit_queued.store(false, Ordering::Release);
        }
    }

    /// Commits every partition with a committable offset and waits for the
    /// broker's answer (at shutdown). Returns how many partitions were
    /// committed.
    pub(super) async fn commit_all(&self) -> Result<usize, ConsumerError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Commit {
                all: true,
                reply: Some(reply),
            })
            .map_err(|_| ConsumerError::Stopped)?;
        answer.await.map_err(|_| ConsumerError::Stopped)?
    }

    /// Commits where every partition with a record stands and waits for
    /// the broker's answer (a new install's first limiter call).
    pub(super) async fn commit_start(&self) -> Result<usize, ConsumerError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Start { reply })
            .map_err(|_| ConsumerError::Stopped)?;
        answer.await.map_err(|_| ConsumerError::Stopped)?
    }

    /// Stops the thread and waits for it. Blocks.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = lock_opt(&self.thread).take() {
            if handle.join().is_err() {
                tracing::warn!("the Kafka poll thread panicked");
            }
        }
        if let Some(handle) = lock_opt(&self.watchdog).take() {
            let _ = handle.join();
        }
    }
}

/// The session's watchdog: a thread that does nothing but tell the session
/// the process is alive, until `stop`. Only a stall of the whole process
/// (a GC-like pause, SIGSTOP, a starved host), the kind that also stops
/// librdkafka's heartbeats, silences it; a poll thread busy in a rebalance
/// callback or a synchronous commit does not (librdkafka itself leaves the
/// group when polls stop past `max.poll.interval.ms`, and says the
/// assignment is lost).
fn watch(session: &SharedSession, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        session.alive(tokio::time::Instant::now());
        std::thread::sleep(ALIVE_EVERY);
    }
}

/// The poll thread: polls, tracks and hands over records, runs the
/// rebalance callbacks (inside the poll) and the commits asked of it.
struct Poller {
    inner: Arc<WorkerConsumer>,
    session: SharedSession,
    records: mpsc::Sender<Record>,
    commands: std_mpsc::Receiver<Command>,
    commit_queued: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// Where the periodic commits' answers arrive.
    answers: CommitQueue,
    /// The header a record's ordering key is read from, if any.
    ordering_header: Option<Arc<str>>,
}

impl Poller {
    fn run(mut self) {
        while !self.stop.load(Ordering::Acquire) {
            self.serve_commands();
            self.read_answers();
            self.tick();
            let record = match self.inner.poll(POLL_TIMEOUT) {
                None => continue,
                Some(Ok(msg)) => self.track(&msg),
                Some(Err(e)) => {
                    KafkaPollFailed {
                        error: &e.to_string(),
                    }
                    .emit();
                    continue;
                }
            };
            if let Some(record) = record {
                self.deliver(record);
            }
        }
        // A final commit asked for just before the stop still gets its answer.
        self.serve_commands();
    }

    /// Tracks a received record as unfinished, or finishes it at once when
    /// the partition's previous owner already did it.
    fn track(&self, msg: &impl Message) -> Option<Record> {
        let topic: Arc<str> = Arc::from(msg.topic());
        let (partition, offset) = (msg.partition(), msg.offset());
        let timestamp = msg.timestamp().to_millis();
        let generation = match self.session.receive(&topic, partition, offset, timestamp) {
            Received::Take { generation } => generation,
            Received::AlreadyDone | Received::Again => return None,
        };
        let headers = match msg.headers() {
            Some(h) => RetryHeaders::from_headers(header_pairs(h)),
            None => Ok(RetryHeaders::default()),
        };
        // The last of that name, as for the worker's own headers.
        let ordering_header = self.ordering_header.as_deref().and_then(|name| {
            msg.headers().and_then(|h| {
                header_pairs(h)
                    .filter(|(n, _)| *n == name)
                    .filter_map(|(_, v)| v)
                    .last()
                    .map(<[u8]>::to_vec)
            })
        });
        Some(Record {
            origin: Origin {
                topic,
                partition,
                offset,
                generation,
            },
            original: OriginalRecord::from_message(msg),
            headers,
            ordering_header,
        })
    }

    /// Hands a record to the worker, waiting while the channel is full (the
    /// worker takes records as fast as it can, so the wait is short; a full
    /// channel is what keeps records fetched past a pause few). Once the
    /// worker stops taking records, they are let go: they stay unfinished,
    /// so uncommitted, and the partition's next owner gets them.
    fn deliver(&mut self, record: Record) {
        if !self.records.is_closed() {
            let _ = self.records.blocking_send(record);
        }
    }

    fn serve_commands(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Commit { all, reply } => {
                    let result = self.commit(all);
                    if let Some(reply) = reply {
                        let _ = reply.send(result);
                    }
                }
                Command::Start { reply } => {
                    let broker = Broker::on_poll_thread(&self.inner, &self.answers);
                    let result = self
                        .session
                        .commit_start(&broker)
                        .map_err(ConsumerError::Commit);
                    let _ = reply.send(result);
                }
            }
        }
    }

    /// Commits the finished prefix (see
    /// [`Session::commit`](crate::kafka::session::Session::commit)).
    fn commit(&mut self, all: bool) -> Result<usize, ConsumerError> {
        if !all {
            self.commit_queued.store(false, Ordering::Release);
        }
        let broker = Broker::on_poll_thread(&self.inner, &self.answers);
        self.session
            .commit(&broker, all)
            .map_err(ConsumerError::Commit)
    }

    /// Tells the session what librdkafka says of the assignment (see
    /// [`Session::tick`]: a fenced session also confirms its ownership
    /// from here).
    ///
    /// [`Session::tick`]: crate::kafka::session::Session::tick
    fn tick(&mut self) {
        let lost = self.inner.assignment_lost();
        let broker = Broker::on_poll_thread(&self.inner, &self.answers);
        self.session
            .tick(&broker, tokio::time::Instant::now(), lost);
    }

    /// Takes the answer of the periodic commit, if it came.
    fn read_answers(&mut self) {
        for answer in self.answers.answers() {
            self.session.answered(&answer);
        }
    }
}
