//! The worker's membership in its consumer group: two consumers, one
//! subscribed to the jobs topic and one to the retry tiers, in the same
//! group (so their committed offsets stay where one consumer of both left
//! them).
//!
//! Why two: an assignor balances a member's partition count over every
//! topic it subscribes to. With one consumer of the jobs topic and every
//! tier, the cooperative assignor could leave a replica only retry-tier
//! partitions, idle while the others carried the jobs. A member of one role
//! takes only that role's partitions, so the jobs topic is spread over the
//! replicas on its own, and so are the tiers, under any protocol; the
//! cheaper cooperative one is then the default (see
//! [`super::consumer::DEFAULT_ASSIGNMENT_STRATEGY`]).
//!
//! Both consumers deliver into one record channel and one partition-event
//! channel; each keeps its own offsets, so every per-record call goes to the
//! consumer of the record's topic.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::KafkaSettings;

use super::consumer::{
    Consumer, ConsumerError, HeldBack, Origin, PartitionEvent, Record, Role, TopicPartition,
    RECORD_CHANNEL,
};

/// The jobs consumer and the retry-tier consumer of one worker.
pub struct Consumers {
    jobs_topic: Arc<str>,
    jobs: Consumer,
    retries: Consumer,
}

impl Consumers {
    /// Creates both consumers (not yet subscribed); partition events of both
    /// go to `events`, and both write their commits to `ledger`, if any. A
    /// revoke waits up to `revoke_wait` for the work under way.
    pub fn new(
        settings: &KafkaSettings,
        events: mpsc::UnboundedSender<PartitionEvent>,
        ledger: Option<Arc<dyn super::ledger::Ledger>>,
        revoke_wait: std::time::Duration,
    ) -> Result<Consumers, ConsumerError> {
        let consumer =
            |role, events, ledger| Consumer::new(settings, role, events, ledger, revoke_wait);
        Ok(Consumers {
            jobs_topic: Arc::from(settings.topic.as_str()),
            jobs: consumer(Role::Jobs, events.clone(), ledger.clone())?,
            retries: consumer(Role::Retries, events, ledger)?,
        })
    }

    /// See [`Consumer::check_topics`]. Blocks.
    pub fn check_topics(
        &self,
        topics: &[&str],
        timeout: std::time::Duration,
    ) -> Result<Vec<usize>, ConsumerError> {
        self.jobs.check_topics(topics, timeout)
    }

    /// Whether the group has never committed an offset on any of the jobs
    /// topic's `partitions`: a new install, which Redis cannot have held
    /// limiter state for. An offset committed on any partition, or no
    /// answer from the broker (an error), says it is not new: a missing
    /// state is then read as lost, the safe side. Blocks.
    pub fn never_committed(
        &self,
        partitions: usize,
        timeout: std::time::Duration,
    ) -> Result<bool, ConsumerError> {
        let parts: Vec<TopicPartition> = (0..partitions)
            .map(|p| TopicPartition::new(&*self.jobs_topic, p as i32))
            .collect();
        let committed = self.jobs.committed(&parts, timeout)?;
        Ok(committed.iter().all(|(_, offset)| offset.is_none()))
    }

    /// Subscribes the jobs consumer to the jobs topic and the retry consumer
    /// to `tiers`.
    pub fn subscribe(&self, tiers: &[&str]) -> Result<(), ConsumerError> {
        self.jobs.subscribe(&[&*self.jobs_topic])?;
        self.retries.subscribe(tiers)
    }

    /// Starts both poll threads; returns the records of both, each with
    /// the value of its header `ordering_header`, if named. Call once.
    pub fn start(
        &self,
        ordering_header: Option<&str>,
    ) -> Result<mpsc::Receiver<Record>, ConsumerError> {
        let (tx, rx) = mpsc::channel(RECORD_CHANNEL);
        let header: Option<Arc<str>> = ordering_header.map(Arc::from);
        self.jobs.start(tx.clone(), header.clone())?;
        self.retries.start(tx, header)?;
        Ok(rx)
    }

    /// The consumer that owns `topic`'s partitions.
    fn of(&self, topic: &str) -> &Consumer {
        if topic == &*self.jobs_topic {
            &self.jobs
        } else {
            &self.retries
        }
    }

    /// Calls `f` with each consumer and its share of `parts`, if any.
    fn split(&self, parts: &[TopicPartition], f: impl Fn(&Consumer, &[TopicPartition])) {
        let (jobs, tiers): (Vec<TopicPartition>, Vec<TopicPartition>) = parts
            .iter()
            .cloned()
            .partition(|tp| tp.topic == self.jobs_topic);
        for (c, share) in [(&self.jobs, jobs), (&self.retries, tiers)] {
            if !share.is_empty() {
                f(c, &share);
            }
        }
    }

    pub fn owns(&self, origin: &Origin) -> bool {
        self.of(&origin.topic).owns(origin)
    }

    pub fn may_start(&self, origin: &Origin) -> bool {
        self.of(&origin.topic).may_start(origin)
    }

    /// Whether either consumer is fenced (issue 53): a stall stops the
    /// whole process, so one fence stops every call.
    pub fn fenced(&self) -> bool {
        // Both looked at: each latches and tells its own fence.
        let jobs = self.jobs.fenced();
        self.retries.fenced() || jobs
    }

    pub fn finish(&self, origin: &Origin) {
        self.of(&origin.topic).finish(origin);
    }

    pub fn pause(&self, parts: &[TopicPartition]) {
        self.split(parts, Consumer::pause);
    }

    pub fn resume(&self, parts: &[TopicPartition]) {
        self.split(parts, Consumer::resume);
    }

    pub fn assignment(&self) -> Vec<TopicPartition> {
        let mut all = self.jobs.assignment();
        all.extend(self.retries.assignment());
        all
    }

    pub fn held_back(&self) -> Vec<HeldBack> {
        let mut all = self.jobs.held_back();
        all.extend(self.retries.held_back());
        all
    }

    pub fn request_commit(&self) {
        self.jobs.request_commit();
        self.retries.request_commit();
    }

    /// Commits both consumers' finished prefixes and waits for the broker;
    /// the first error wins, after both were tried.
    pub async fn commit_all(&self) -> Result<usize, ConsumerError> {
        let (jobs, retries) = tokio::join!(self.jobs.commit_all(), self.retries.commit_all());
        Ok(jobs? + retries?)
    }

    /// Commits where each jobs partition with a record stands, nothing
    /// finished included: the group has begun (`Session::commit_start`).
    /// Only the jobs topic: a new install is read off its commits
    /// ([`never_committed`](Self::never_committed)).
    pub async fn commit_start(&self) -> Result<usize, ConsumerError> {
        self.jobs.commit_start().await
    }

    /// Stops both poll threads. Blocks: call it off the async threads.
    pub fn shutdown(&self) {
        self.jobs.shutdown();
        self.retries.shutdown();
    }
}
