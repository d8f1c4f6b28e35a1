//! The simulated broker and consumer: topic logs, the group's committed
//! offsets, and one consumer incarnation ([`SimSource`]) at a time, which
//! delivers records, tracks offsets with the worker's own tracker
//! (`kafka::Offsets`, pure), and goes through revokes and assignments.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use throttle_worker::kafka::consumer::{HeldBack, Origin, PartitionEvent, Record, TopicPartition};
use throttle_worker::kafka::{Offsets, OriginalRecord, Position, RetryHeaders};
use throttle_worker::worker::{CommitError, Source};
use tokio::sync::{mpsc, Notify};

use super::journal::Journal;

/// One record in a topic's log.
#[derive(Debug, Clone)]
pub struct SimRecord {
    pub key: Option<Vec<u8>>,
    pub value: Bytes,
    pub headers: RetryHeaders,
}

pub type Tp = (String, i32);

/// Topic logs and the group's committed offsets.
#[derive(Debug, Default)]
pub struct Broker {
    pub logs: BTreeMap<Tp, Vec<SimRecord>>,
    pub committed: BTreeMap<Tp, i64>,
    /// A rebalance is under way: commits are refused (as the mock does).
    pub rebalancing: bool,
}

impl Broker {
    pub fn append(&mut self, tp: &Tp, rec: SimRecord) -> i64 {
        let log = self.logs.entry(tp.clone()).or_default();
        log.push(rec);
        log.len() as i64 - 1
    }
}

pub type SharedBroker = Arc<Mutex<Broker>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The consumer's own state.
#[derive(Debug, Default)]
struct State {
    offsets: Offsets,
    generations: BTreeMap<Tp, u64>,
    /// Owned partitions and the next offset to deliver.
    owned: BTreeMap<Tp, i64>,
    paused: BTreeSet<Tp>,
}

/// One consumer incarnation (a process's lifetime).
pub struct SimSource {
    broker: SharedBroker,
    journal: Arc<Journal>,
    state: Mutex<State>,
    pub wake: Arc<Notify>,
    pub dead: Arc<AtomicBool>,
    /// The tracker's generation counter continues across incarnations, so
    /// an origin from a dead incarnation is never current.
    base_generation: u64,
}

impl SimSource {
    pub fn new(
        broker: SharedBroker,
        journal: Arc<Journal>,
        wake: Arc<Notify>,
        dead: Arc<AtomicBool>,
        base_generation: u64,
    ) -> SimSource {
        SimSource {
            broker,
            journal,
            state: Mutex::new(State::default()),
            wake,
            dead,
            base_generation,
        }
    }

    /// Takes `parts`, from their committed offsets.
    pub fn assign(&self, parts: &[Tp], events: &mpsc::UnboundedSender<PartitionEvent>) {
        let broker = lock(&self.broker);
        let mut st = lock(&self.state);
        for tp in parts {
            let from = broker.committed.get(tp).copied().unwrap_or(0);
            st.owned.insert(tp.clone(), from);
            st.paused.remove(tp);
            *st.generations
                .entry(tp.clone())
                .or_insert(self.base_generation) += 1;
        }
        drop(st);
        drop(broker);
        let _ = events.send(PartitionEvent::Assigned(
            parts
                .iter()
                .map(|(t, p)| TopicPartition::new(t.as_str(), *p))
                .collect(),
        ));
        self.wake.notify_one();
    }

    /// Gives `parts` up: commits their finished prefix (unless the broker
    /// refuses), then forgets them, as the rebalance callback does.
    pub fn revoke(
        &self,
        parts: &[Tp],
        refuse_commit: bool,
        events: &mpsc::UnboundedSender<PartitionEvent>,
    ) {
        let mut st = lock(&self.state);
        if !refuse_commit {
            self.commit_locked(&mut st, Some(parts));
        }
        for tp in parts {
            st.owned.remove(tp);
            st.paused.remove(tp);
            st.offsets.remove_partition(&tp.0, tp.1);
            *st.generations
                .entry(tp.clone())
                .or_insert(self.base_generation) += 1;
        }
        drop(st);
        let _ = events.send(PartitionEvent::Revoked(
            parts
                .iter()
                .map(|(t, p)| TopicPartition::new(t.as_str(), *p))
                .collect(),
        ));
    }

    pub fn owned(&self) -> Vec<Tp> {
        lock(&self.state).owned.keys().cloned().collect()
    }

    pub fn max_generation(&self) -> u64 {
        lock(&self.state)
            .generations
            .values()
            .copied()
            .max()
            .unwrap_or(self.base_generation)
    }

    /// Up to `max` records of owned, unpaused partitions, in partition order.
    pub fn take_records(&self, max: usize) -> Vec<Record> {
        let broker = lock(&self.broker);
        let mut st = lock(&self.state);
        let mut out = Vec::new();
        let parts: Vec<Tp> = st.owned.keys().cloned().collect();
        for tp in parts {
            if st.paused.contains(&tp) {
                continue;
            }
            let Some(log) = broker.logs.get(&tp) else {
                continue;
            };
            while out.len() < max {
                let next = st.owned[&tp];
                let Some(rec) = log.get(next as usize) else {
                    break;
                };
                if st.offsets.track(&tp.0, tp.1, next).is_err() {
                    break;
                }
                st.owned.insert(tp.clone(), next + 1);
                let generation = st.generations[&tp];
                self.journal.delivered(&tp, next, &rec.value);
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
                });
            }
        }
        out
    }

    /// Commits the finished prefix of `only` (or of every partition).
    fn commit_locked(&self, st: &mut State, only: Option<&[Tp]>) -> usize {
        let mut broker = lock(&self.broker);
        if broker.rebalancing {
            return 0;
        }
        let commits = st.offsets.committable();
        let mut n = 0;
        for c in &commits {
            let tp = (c.topic.clone(), c.partition);
            if only.is_some_and(|o| !o.contains(&tp)) {
                continue;
            }
            if let Some(log) = broker.logs.get(&tp) {
                self.journal.check_commit(&tp, c.offset, log);
            }
            broker.committed.insert(tp, c.offset);
            n += 1;
        }
        st.offsets.mark_committed(&commits);
        n
    }
}

impl Source for SimSource {
    fn owns(&self, origin: &Origin) -> bool {
        let st = lock(&self.state);
        let tp = (origin.topic.to_string(), origin.partition);
        st.owned.contains_key(&tp) && st.generations.get(&tp) == Some(&origin.generation)
    }

    fn finish(&self, origin: &Origin) {
        if self.dead.load(Ordering::SeqCst) || !self.owns(origin) {
            return;
        }
        let mut st = lock(&self.state);
        st.offsets
            .finish(&origin.topic, origin.partition, origin.offset);
    }

    fn pause(&self, parts: &[TopicPartition]) {
        let mut st = lock(&self.state);
        for part in parts {
            let tp = (part.topic.to_string(), part.partition);
            if st.owned.contains_key(&tp) {
                st.paused.insert(tp);
            }
        }
    }

    fn resume(&self, parts: &[TopicPartition]) {
        let mut st = lock(&self.state);
        for part in parts {
            st.paused.remove(&(part.topic.to_string(), part.partition));
        }
        drop(st);
        self.wake.notify_one();
    }

    fn assignment(&self) -> Vec<TopicPartition> {
        lock(&self.state)
            .owned
            .keys()
            .map(|(t, p)| TopicPartition::new(t.as_str(), *p))
            .collect()
    }

    fn held_back(&self) -> Vec<HeldBack> {
        lock(&self.state)
            .offsets
            .held_back()
            .into_iter()
            .map(|(topic, partition, offset, finished_behind)| HeldBack {
                partition: TopicPartition::new(topic.as_str(), partition),
                offset,
                finished_behind,
            })
            .collect()
    }

    fn request_commit(&self) {
        if self.dead.load(Ordering::SeqCst) {
            return;
        }
        let mut st = lock(&self.state);
        self.commit_locked(&mut st, None);
    }

    async fn commit_all(&self) -> Result<usize, CommitError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(CommitError::Stopped);
        }
        let mut st = lock(&self.state);
        if lock(&self.broker).rebalancing {
            return Err(CommitError::Refused("rebalance in progress".to_owned()));
        }
        Ok(self.commit_locked(&mut st, None))
    }
}

/// Hands records to the engine while the incarnation lives: in small
/// batches, waiting on `wake` when there is nothing to deliver.
pub async fn deliver(source: Arc<SimSource>, tx: mpsc::Sender<Record>) {
    loop {
        if source.dead.load(Ordering::SeqCst) {
            return;
        }
        let batch = source.take_records(8);
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
