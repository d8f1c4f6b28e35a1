//! The simulated broker and consumer: topic logs, the group's committed
//! offsets and their metadata, and one consumer incarnation
//! ([`SimSource`]) per process, which runs the worker's own consumer logic
//! (`kafka::session::Session`: revokes, assignments and the skip of what
//! the last owner finished, asynchronous commits and their answers) over a
//! deterministic broker, and delivers records as the poll thread does.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use throttle_worker::kafka::consumer::{HeldBack, Origin, PartitionEvent, Record, TopicPartition};
use throttle_worker::kafka::fence::Watch;
use throttle_worker::kafka::ledger::{Entry, Ledger, LedgerError};
use throttle_worker::kafka::record::Quiet;
use throttle_worker::kafka::session::{Answer, AsyncCommits, Coordinator, Received, Session};
use throttle_worker::kafka::{Commit, Finish, OriginalRecord, Position, RetryHeaders};
use throttle_worker::worker::{CommitError, Source};
use tokio::sync::{mpsc, Notify};

use super::journal::Journal;
use super::ports::{Stall, World};

/// One record in a topic's log.
#[derive(Debug, Clone)]
pub struct SimRecord {
    pub key: Option<Vec<u8>>,
    pub value: Bytes,
    pub headers: RetryHeaders,
}

pub type Tp = (String, i32);

/// Topic logs, the group's committed offsets, and the handoff ledger.
#[derive(Debug, Default)]
pub struct Broker {
    pub logs: BTreeMap<Tp, Vec<SimRecord>>,
    /// Each partition's committed offset and its metadata.
    pub committed: BTreeMap<Tp, (i64, String)>,
    /// A rebalance is under way: commits are refused (as the mock does).
    pub rebalancing: bool,
    /// The handoff ledger's entries ([`SimLedger`]), and how many of the
    /// world's Redis data losses it has suffered.
    pub ledger: BTreeMap<Tp, Entry>,
    pub ledger_losses: usize,
    /// Every commit the broker took, by partition: when (virtual ms), the
    /// offset and its metadata, oldest first; what a lost commit goes
    /// back to (`Faults::lost_commits`).
    pub history: BTreeMap<Tp, Vec<(u64, i64, String)>>,
}

impl Broker {
    pub fn append(&mut self, tp: &Tp, rec: SimRecord) -> i64 {
        let log = self.logs.entry(tp.clone()).or_default();
        log.push(rec);
        log.len() as i64 - 1
    }

    /// The committed offset of `tp` (0: none).
    pub fn committed_offset(&self, tp: &Tp) -> i64 {
        self.committed.get(tp).map_or(0, |(o, _)| *o)
    }

    /// Takes a commit of `tp` at `at_ms`.
    pub fn commit(&mut self, tp: Tp, offset: i64, metadata: String, at_ms: u64) {
        self.history
            .entry(tp.clone())
            .or_default()
            .push((at_ms, offset, metadata.clone()));
        self.committed.insert(tp, (offset, metadata));
    }

    /// The broker loses the commits of the last `age_ms` before `at_ms`
    /// (issue 53, item 4: an unclean failover of the group's coordinator,
    /// whose offsets log missed them): each partition's committed offset
    /// and metadata go back to the newest commit made at least that long
    /// ago. A partition with no commit that old keeps its own (the group
    /// never goes back to "never committed", which would read as a new
    /// install). Returns each partition that went back: what it lost
    /// (offset, metadata), and where it went back to.
    pub fn lose_commits(&mut self, at_ms: u64, age_ms: u64) -> Vec<LostCommit> {
        let before = at_ms.saturating_sub(age_ms);
        let mut lost = Vec::new();
        for (tp, history) in &mut self.history {
            let Some(keep) = history.iter().rposition(|(at, _, _)| *at <= before) else {
                continue;
            };
            if keep + 1 == history.len() {
                continue;
            }
            let (_, offset, metadata) = history[keep].clone();
            history.truncate(keep + 1);
            let was = self
                .committed
                .insert(tp.clone(), (offset, metadata.clone()))
                .expect("a partition with a history is committed");
            lost.push(LostCommit {
                tp: tp.clone(),
                lost: was,
                back_to: (offset, metadata),
            });
        }
        lost
    }
}

/// A partition's commit the broker lost ([`Broker::lose_commits`]).
#[derive(Debug, Clone)]
pub struct LostCommit {
    pub tp: Tp,
    /// The offset and metadata it had.
    pub lost: (i64, String),
    /// The older commit it went back to.
    pub back_to: (i64, String),
}

impl LostCommit {
    /// The records the lost commit said were finished and the older one
    /// does not: those below its offset from the older offset on, and
    /// those its metadata named. A new owner may do them again.
    pub fn dropped(&self) -> throttle_worker::kafka::done_ranges::Ranges {
        use throttle_worker::kafka::done_ranges::{decode, push, Ranges};
        let (lost, lost_meta) = (&self.lost.0, &self.lost.1);
        let (back, back_meta) = (&self.back_to.0, &self.back_to.1);
        let kept = decode(*back, back_meta);
        let kept = |o: i64| o < *back || kept.iter().any(|(lo, hi)| (*lo..=*hi).contains(&o));
        let mut named: Vec<i64> = (*back..*lost).collect();
        for (lo, hi) in decode(*lost, lost_meta) {
            named.extend(lo..=hi);
        }
        named.sort_unstable();
        let mut out = Ranges::new();
        for o in named.into_iter().filter(|o| !kept(*o)) {
            push(&mut out, o, o);
        }
        out
    }
}

pub type SharedBroker = Arc<Mutex<Broker>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The handoff ledger where the worker keeps it, in Redis: it fails while
/// Redis errs or hangs (the worker's waits are bounded, so a hang is a
/// failure too), and a loss of Redis' data empties it. A fault of its
/// process's own (`Faults::replica_redis`) fails it too.
pub struct SimLedger {
    pub world: Arc<World>,
    /// The process's id in the fleet (`World::members`).
    pub process: u64,
}

impl SimLedger {
    /// How many of the world's Redis data losses have happened by now: an
    /// entry written in one count is gone in the next.
    pub fn losses(&self) -> usize {
        let at = self.world.now_ms();
        self.world
            .faults
            .state_losses
            .iter()
            .filter(|&&t| t <= at)
            .count()
    }

    /// Whether a call now would reach it.
    pub fn reachable(&self) -> bool {
        let w = &self.world;
        let at = w.now_ms();
        !w.faults
            .redis_errors
            .iter()
            .chain(&w.faults.redis_hangs)
            .any(|win| win.contains(at))
            && w.cut_off(self.process, at).is_none()
    }

    fn reach(&self) -> Result<std::sync::MutexGuard<'_, Broker>, LedgerError> {
        let w = &self.world;
        let at = w.now_ms();
        if w.faults
            .redis_errors
            .iter()
            .chain(&w.faults.redis_hangs)
            .any(|win| win.contains(at))
            || w.cut_off(self.process, at).is_some()
        {
            return Err(LedgerError("Redis is unreachable".to_owned()));
        }
        let mut broker = lock(&w.broker);
        let due = w.faults.state_losses.iter().filter(|&&t| t <= at).count();
        if broker.ledger_losses < due {
            broker.ledger_losses = due;
            broker.ledger.clear();
        }
        Ok(broker)
    }
}

impl Ledger for SimLedger {
    fn write(&self, commits: &[Commit]) -> Result<(), LedgerError> {
        let mut broker = self.reach()?;
        for c in commits {
            broker
                .ledger
                .insert((c.topic.clone(), c.partition), Entry::of(c));
        }
        Ok(())
    }

    fn read(&self, partitions: &[(String, i32)]) -> Result<Vec<Option<Entry>>, LedgerError> {
        let broker = self.reach()?;
        Ok(partitions
            .iter()
            .map(|tp| broker.ledger.get(tp).cloned())
            .collect())
    }
}

/// What the consumer fetches: the broker-side position of each owned
/// partition, and the paused ones (librdkafka's part; the bookkeeping is
/// the worker's own [`Session`]).
#[derive(Debug, Default)]
struct Fetch {
    /// Owned partitions and the next offset to deliver.
    owned: BTreeMap<Tp, i64>,
    paused: BTreeSet<Tp>,
    /// Partitions whose revoke waits for the worker: not fetched (the
    /// poll thread is inside the rebalance callback).
    revoking: BTreeSet<Tp>,
    /// Where each owned partition's assignment began, and the furthest
    /// position delivered in it: a record below that delivered again is
    /// a redelivery (`Faults::redeliveries`).
    began: BTreeMap<Tp, (i64, i64)>,
    /// How many of `Faults::redeliveries` this incarnation has applied
    /// (those before its start count as applied).
    redeliveries: usize,
}

/// One consumer incarnation (a process's lifetime): the worker's own
/// session logic ([`Session`]: revokes, assignments with the metadata
/// skip, periodic asynchronous commits and their answers, the final
/// commit) over a deterministic broker.
pub struct SimSource {
    broker: SharedBroker,
    journal: Arc<Journal>,
    session: Session,
    ledger: Arc<SimLedger>,
    fetch: Mutex<Fetch>,
    /// Answers of asynchronous commits, handed to the session at the next
    /// poll (as librdkafka's commit queue is read between polls).
    answers: Mutex<VecDeque<Answer>>,
    pub wake: Arc<Notify>,
    pub dead: Arc<AtomicBool>,
    /// The longest a revoke waits for the worker (`worker.revoke_wait`).
    revoke_wait: Duration,
    /// The process's stall, if one comes (`Scenario::stalls`).
    pub stall: Arc<Stall>,
    /// The group expired this member's session (a stall past its
    /// timeout): the coordinator refuses its commits until its next
    /// assignment, a new generation.
    expelled: AtomicBool,
    /// `heartbeat.interval.ms` of a watched session: its first heartbeat
    /// after a stall is answered this long after the stall ends.
    heartbeat: Duration,
}

/// The simulated broker as the session's coordinator: a commit is refused
/// while the group rebalances (the synchronous one as a whole, the
/// asynchronous one partition by partition, both of which librdkafka
/// reports); the answer of an asynchronous one waits for the next poll.
struct Coord<'a> {
    source: &'a SimSource,
}

impl Coordinator for Coord<'_> {
    type Error = String;

    fn commit_sync(&self, commits: &[Commit]) -> Result<(), String> {
        if self.source.expelled() {
            return Err("unknown member id: the session expired".to_owned());
        }
        let mut broker = lock(&self.source.broker);
        if broker.rebalancing {
            return Err("rebalance in progress".to_owned());
        }
        self.source.apply(&mut broker, commits);
        Ok(())
    }

    fn committed(&self, parts: &[TopicPartition]) -> Result<Vec<Option<(i64, String)>>, String> {
        let broker = lock(&self.source.broker);
        Ok(parts
            .iter()
            .map(|tp| {
                broker
                    .committed
                    .get(&(tp.topic.to_string(), tp.partition))
                    .cloned()
            })
            .collect())
    }
}

impl AsyncCommits for Coord<'_> {
    fn send(&self, commits: &[Commit]) -> Result<(), String> {
        let mut broker = lock(&self.source.broker);
        let answer = if self.source.expelled() {
            Answer {
                error: Some("unknown member id: the session expired".to_owned()),
                refused: Vec::new(),
            }
        } else if broker.rebalancing {
            Answer {
                error: None,
                refused: commits
                    .iter()
                    .map(|c| {
                        (
                            c.topic.clone(),
                            c.partition,
                            "rebalance in progress".to_owned(),
                        )
                    })
                    .collect(),
            }
        } else {
            self.source.apply(&mut broker, commits);
            Answer::default()
        };
        lock(&self.source.answers).push_back(answer);
        self.source.wake.notify_one();
        Ok(())
    }
}

impl SimSource {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        broker: SharedBroker,
        journal: Arc<Journal>,
        ledger: Arc<SimLedger>,
        wake: Arc<Notify>,
        dead: Arc<AtomicBool>,
        revoke_wait: Duration,
        stall: Arc<Stall>,
        watch: Option<Watch>,
    ) -> SimSource {
        let before = ledger.world.faults.redeliveries.iter();
        let fetch = Fetch {
            redeliveries: before
                .filter(|(at, _)| *at <= ledger.world.now_ms())
                .count(),
            ..Fetch::default()
        };
        let session = Session::new(Some(ledger.clone()));
        SimSource {
            revoke_wait,
            stall,
            expelled: AtomicBool::new(false),
            heartbeat: watch.map_or(Duration::ZERO, |w| w.confirm_after - w.stall_after),
            broker,
            journal,
            session: match watch {
                Some(watch) => session.watched(watch),
                None => session,
            },
            ledger,
            fetch: Mutex::new(fetch),
            answers: Mutex::default(),
            wake,
            dead,
        }
    }

    fn coord(&self) -> Coord<'_> {
        Coord { source: self }
    }

    /// Commits where each partition with a record stands, nothing finished
    /// included (a new install's first limiter call:
    /// `Session::commit_start`), refused during a rebalance.
    pub fn commit_start(&self) -> Result<usize, String> {
        if self.dead.load(Ordering::SeqCst) {
            return Err("stopped".to_owned());
        }
        self.session.commit_start(&self.coord())
    }

    /// Writes accepted commits, each checked against what is finished.
    fn apply(&self, broker: &mut Broker, commits: &[Commit]) {
        let now = self.ledger.world.now_ms();
        for c in commits {
            let tp = (c.topic.clone(), c.partition);
            if let Some(log) = broker.logs.get(&tp) {
                self.journal.check_commit(&tp, c.offset, log);
            }
            broker.commit(tp, c.offset, c.metadata.clone(), now);
        }
    }

    /// Whether the group expired this member's session.
    pub fn expelled(&self) -> bool {
        self.expelled.load(Ordering::SeqCst)
    }

    /// The group expires this member's session (a stall past its timeout):
    /// its partitions are another's, its commits refused.
    pub fn expel(&self) {
        self.expelled.store(true, Ordering::SeqCst);
    }

    /// The watchdog's and the poll thread's signs of life (a watched
    /// session's; see `kafka::fence`): none while the process stalls.
    /// The poll thread's tick carries librdkafka's lost flag: set once
    /// the first heartbeat after a stall that expired the session is
    /// refused, a heartbeat interval after the stall ends (the rebalance
    /// that follows is [`SimSource::lose`]'s).
    pub fn tick(&self) {
        let now = tokio::time::Instant::now();
        self.session.alive(now);
        let lost = self.expelled()
            && self
                .stall
                .ended(now)
                .is_some_and(|to| now >= to + self.heartbeat);
        self.session.tick(&self.coord(), now, lost);
    }

    /// The assignment is lost: after a stall past the session timeout, the
    /// first heartbeat is refused and librdkafka revokes everything with
    /// its lost flag. As the worker's callback takes it: fenced until the
    /// next assignment, the calls out finish, the commit is tried (and
    /// refused: not a member), then the partitions are forgotten. Not a
    /// graceful handoff (the partitions were another's already): nothing
    /// is journalled as one.
    pub async fn lose(&self, events: &mpsc::UnboundedSender<PartitionEvent>) {
        self.session.lost(tokio::time::Instant::now());
        let parts = self.owned();
        if parts.is_empty() {
            return;
        }
        let tps = topic_partitions(&parts);
        if !self.dead.load(Ordering::SeqCst) {
            self.wait_for_work(&parts, &tps, events).await;
            self.session.revoke(&self.coord(), &tps);
        }
        self.stop_fetching(&parts);
        let _ = events.send(PartitionEvent::Revoked(tps));
    }

    /// Takes `parts`, from their committed offsets, as the rebalance's
    /// assignment callback does (reading what the last owner finished).
    pub fn assign(&self, parts: &[Tp], events: &mpsc::UnboundedSender<PartitionEvent>) {
        // A new generation: a member again.
        self.expelled.store(false, Ordering::SeqCst);
        let tps = topic_partitions(parts);
        let read = self.ledger.reachable().then(|| self.ledger.losses());
        self.session.assign(&self.coord(), &tps);
        let broker = lock(&self.broker);
        // A ledger entry whose writer saw the broker accept more than the
        // broker's commit now holds is not read against it: the broker
        // lost a commit (`Faults::lost_commits`; or an operator moved the
        // offsets back, which the ledger must not undo).
        let behind: Vec<Tp> = parts
            .iter()
            .filter(|tp| {
                let kafka = broker.committed.get(*tp).map(|(o, _)| *o);
                broker.ledger.get(*tp).is_some_and(|e| kafka < e.acked)
            })
            .cloned()
            .collect();
        self.journal.assigned(parts, read, &behind);
        let mut fetch = lock(&self.fetch);
        for tp in parts {
            let from = broker.committed_offset(tp);
            fetch.owned.insert(tp.clone(), from);
            fetch.began.insert(tp.clone(), (from, from));
            fetch.paused.remove(tp);
        }
        drop(fetch);
        drop(broker);
        let _ = events.send(PartitionEvent::Assigned(tps));
        self.wake.notify_one();
    }

    /// The session is found lost (librdkafka's lost flag, or a stall past
    /// the session timeout): no call starts until a new assignment.
    pub fn fence(&self) {
        self.session.lost(tokio::time::Instant::now());
    }

    /// Gives `parts` up, as the rebalance's revoke callback does: waits
    /// for the worker's work under way on them (within `revoke_wait`),
    /// commits their finished prefix (unless the broker refuses), then
    /// forgets them.
    pub async fn revoke(&self, parts: &[Tp], events: &mpsc::UnboundedSender<PartitionEvent>) {
        let tps = topic_partitions(parts);
        if !self.dead.load(Ordering::SeqCst) {
            self.wait_for_work(parts, &tps, events).await;
        }
        if !self.dead.load(Ordering::SeqCst) {
            // The ledger is written first, then the commit is asked for:
            // what is finished reaches the next owner if either takes it.
            let written = self.ledger.reachable().then(|| self.ledger.losses());
            let refused = lock(&self.broker).rebalancing;
            self.session.revoke(&self.coord(), &tps);
            self.journal.handed_over(parts, !refused, written);
        }
        self.stop_fetching(parts);
        let _ = events.send(PartitionEvent::Revoked(tps));
    }

    /// Forgets `parts` in the fetch state (a revoke's or a loss's last
    /// step): no longer owned, paused or waiting on a revoke.
    fn stop_fetching(&self, parts: &[Tp]) {
        let mut fetch = lock(&self.fetch);
        for tp in parts {
            fetch.owned.remove(tp);
            fetch.began.remove(tp);
            fetch.paused.remove(tp);
            fetch.revoking.remove(tp);
        }
    }

    /// The revoke's first step, as the worker's rebalance callback takes
    /// it: the partitions start nothing new, and the engine says when their
    /// work under way has ended; at `revoke_wait` the revoke goes on
    /// without it (journalled: a success answered later may be done again).
    async fn wait_for_work(
        &self,
        parts: &[Tp],
        tps: &[TopicPartition],
        events: &mpsc::UnboundedSender<PartitionEvent>,
    ) {
        self.session.begin_revoke(tps);
        lock(&self.fetch).revoking.extend(parts.iter().cloned());
        let (quiet, rx) = Quiet::new();
        let event = PartitionEvent::Revoking {
            parts: tps.to_vec(),
            quiet,
        };
        if events.send(event).is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.revoke_wait;
        loop {
            match rx.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                // Told, or the engine is gone (killed, stopped).
                _ => return,
            }
            if self.dead.load(Ordering::SeqCst) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                self.journal.bound_passed(parts, self.ledger.world.now_ms());
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    pub fn owned(&self) -> Vec<Tp> {
        lock(&self.fetch).owned.keys().cloned().collect()
    }

    /// One poll: the commit answers that came, then up to `max` records of
    /// owned, unpaused partitions, in partition order. A record the
    /// partition's previous owner finished is skipped here, by the
    /// session, as the worker's poll thread skips it.
    pub fn poll(&self, max: usize) -> Vec<Record> {
        let answers: Vec<Answer> = lock(&self.answers).drain(..).collect();
        for answer in &answers {
            self.session.answered(answer);
        }
        let broker = lock(&self.broker);
        let mut fetch = lock(&self.fetch);
        self.redeliver(&mut fetch);
        let mut out = Vec::new();
        let parts: Vec<Tp> = fetch.owned.keys().cloned().collect();
        for tp in parts {
            if fetch.paused.contains(&tp) || fetch.revoking.contains(&tp) {
                continue;
            }
            let Some(log) = broker.logs.get(&tp) else {
                continue;
            };
            while out.len() < max {
                let next = fetch.owned[&tp];
                let Some(rec) = log.get(next as usize) else {
                    break;
                };
                fetch.owned.insert(tp.clone(), next + 1);
                let again = match fetch.began.get_mut(&tp) {
                    Some((_, furthest)) if next < *furthest => true,
                    Some((_, furthest)) => {
                        *furthest = next + 1;
                        false
                    }
                    None => false,
                };
                let received = self.session.receive(&tp.0, tp.1, next, None);
                if again {
                    self.journal.delivered_again(
                        &tp,
                        next,
                        matches!(received, Received::Take { .. }),
                    );
                }
                let generation = match received {
                    Received::Take { generation } => generation,
                    Received::AlreadyDone => {
                        self.journal.skipped(&tp, next, &rec.value);
                        self.journal.finished(&tp, next);
                        continue;
                    }
                    Received::Again => continue,
                };
                self.journal
                    .delivered(&tp, next, &rec.value, self.expelled());
                let here = Position {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    offset: next,
                };
                out.push(Record {
                    origin: Origin {
                        topic: Arc::from(tp.0.as_str()),
                        partition: tp.1,
                        offset: next,
                        generation,
                    },
                    original: OriginalRecord {
                        origin: rec.headers.original.clone().unwrap_or(here),
                        key: rec.key.clone(),
                        value: rec.value.clone(),
                        trace: Default::default(),
                    },
                    headers: Ok(rec.headers.clone()),
                    ordering_header: None,
                });
            }
        }
        out
    }
}

impl SimSource {
    /// Applies the redeliveries due by now (`Faults::redeliveries`): each
    /// owned partition's position goes back that many records, never
    /// before its assignment's start.
    fn redeliver(&self, fetch: &mut Fetch) {
        let world = &self.ledger.world;
        let now = world.now_ms();
        let due = world
            .faults
            .redeliveries
            .iter()
            .filter(|(at, _)| *at <= now);
        for &(_, back) in due.skip(fetch.redeliveries) {
            fetch.redeliveries += 1;
            let Fetch { owned, began, .. } = &mut *fetch;
            for (tp, at) in owned.iter_mut() {
                let from = began.get(tp).map_or(*at, |(from, _)| *from);
                *at = (*at - back).max(from);
            }
        }
    }
}

fn topic_partitions(parts: &[Tp]) -> Vec<TopicPartition> {
    parts
        .iter()
        .map(|(t, p)| TopicPartition::new(t.as_str(), *p))
        .collect()
}

impl Source for SimSource {
    fn owns(&self, origin: &Origin) -> bool {
        self.session.owns(origin)
    }

    fn may_start(&self, origin: &Origin) -> bool {
        self.session.may_start(origin)
    }

    fn fenced(&self) -> bool {
        // A stalled process's check runs when the stall ends: the gap
        // since its last sign of life is seen then.
        let now = tokio::time::Instant::now();
        self.session.fenced(self.stall.runs_at(now))
    }

    fn finish(&self, origin: &Origin) {
        if self.dead.load(Ordering::SeqCst) {
            return;
        }
        // A member whose session expired finishes its records for itself
        // alone: the partition is another's, whose handoffs carry only
        // what it finished.
        if self.expelled() {
            self.session.finish(origin);
            return;
        }
        let waiting = self.session.owns(origin) && !self.session.may_start(origin);
        if self.session.finish(origin) == Finish::Finished {
            let tp = (origin.topic.to_string(), origin.partition);
            self.journal.finished(&tp, origin.offset);
            if waiting {
                // Finished while its revoke waits: committed by this owner.
                self.journal
                    .with(|log| log.reach.finished_in_revoke_wait += 1);
            }
        }
    }

    fn pause(&self, parts: &[TopicPartition]) {
        let mut fetch = lock(&self.fetch);
        for part in parts {
            let tp = (part.topic.to_string(), part.partition);
            if fetch.owned.contains_key(&tp) {
                fetch.paused.insert(tp);
            }
        }
    }

    fn resume(&self, parts: &[TopicPartition]) {
        let mut fetch = lock(&self.fetch);
        for part in parts {
            fetch
                .paused
                .remove(&(part.topic.to_string(), part.partition));
        }
        drop(fetch);
        self.wake.notify_one();
    }

    fn assignment(&self) -> Vec<TopicPartition> {
        topic_partitions(&self.owned())
    }

    fn held_back(&self) -> Vec<HeldBack> {
        self.session.held_back()
    }

    fn request_commit(&self) {
        // A stalled process sends nothing; its next commit goes after.
        if self.dead.load(Ordering::SeqCst)
            || self.stall.until(tokio::time::Instant::now()).is_some()
        {
            return;
        }
        let _ = self.session.commit(&self.coord(), false);
    }

    async fn commit_all(&self) -> Result<usize, CommitError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(CommitError::Stopped);
        }
        // A graceful stop hands every partition it holds over with this
        // commit, as a revoke does: its ledger is written first, then the
        // commit is asked for, and the journal judges the next owner's
        // deliveries against both (invariant 12; 16's excuse when neither
        // could carry a finished record: seed 2885, a leave in a Redis
        // outage during a rebalance, was judged as if it had carried all).
        let written = self.ledger.reachable().then(|| self.ledger.losses());
        let result = self.session.commit(&self.coord(), true);
        self.journal
            .handed_over(&self.owned(), result.is_ok(), written);
        let n = result.map_err(CommitError::Refused)?;
        // The final commit is made: closing revokes commit nothing.
        self.session.close();
        Ok(n)
    }
}

/// Hands records to the engine while the incarnation lives: in small
/// batches, waiting on `wake` when there is nothing to deliver.
pub async fn deliver(source: Arc<SimSource>, tx: mpsc::Sender<Record>, fetch: usize) {
    loop {
        if source.dead.load(Ordering::SeqCst) {
            return;
        }
        // A stalled process polls nothing.
        source.stall.wait().await;
        let batch = source.poll(fetch);
        if batch.is_empty() {
            // A wake-up may come for nothing; the timeout covers a wake
            // that raced the check.
            let _ = tokio::time::timeout(Duration::from_millis(500), source.wake.notified()).await;
            continue;
        }
        for rec in batch {
            if tx.send(rec).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The session's signs of life while the incarnation lives (a watched
/// session's: `kafka::fence`), every `every`; none while it stalls.
pub async fn watchdog(source: Arc<SimSource>, every: Duration) {
    while !source.dead.load(Ordering::SeqCst) {
        source.stall.wait().await;
        source.tick();
        tokio::time::sleep(every).await;
    }
}
