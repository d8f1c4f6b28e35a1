//! `[kafka]`: the brokers and the group, the topics (jobs, retry tiers,
//! dead letters) and librdkafka's property tables.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::duration::{human_duration, human_durations};
use super::error::{self, Invalid};
use super::redact::redacted;

/// `[kafka]`. `Debug` shows the secret properties as `***`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap servers, comma separated (librdkafka `bootstrap.servers`).
    pub brokers: String,
    /// The consumer group every replica joins.
    pub group_id: String,
    /// Static group membership (librdkafka `group.instance.id`): a replica
    /// that restarts with the same id within `session.timeout.ms` gets its
    /// partitions back without a rebalance of the whole group. Unique per
    /// replica, stable across its restarts: in Kubernetes, a StatefulSet's
    /// pod name (`THROTTLE__KAFKA__GROUP_INSTANCE_ID` from the downward
    /// API). Empty: dynamic membership.
    #[serde(default)]
    pub group_instance_id: String,
    /// Topic of product-registration jobs.
    pub topic: String,
    /// Prefix of the retry topics: a job whose wait is longer than
    /// `worker.max_inline_delay` goes to `{retry_topic_prefix}.{tier}` (e.g.
    /// `product-registrations.retry.1m`), one topic per `retry_tiers` entry.
    /// The same workers consume them.
    pub retry_topic_prefix: String,
    /// Delays of the retry topics, shortest first. A record written to tier
    /// `d` is held for exactly `d` by the consumer, so each topic stays in
    /// due order and a record never waits behind one due later; a job
    /// waiting longer than a tier hops down the tiers until its due time.
    /// The longest tier is the longest a retry partition is ever held: keep
    /// it well under the retry topics' retention.
    #[serde(deserialize_with = "human_durations")]
    pub retry_tiers: Vec<Duration>,
    /// Topic for jobs that can never succeed, with the reason in `x-error`.
    pub dlq_topic: String,
    /// Passed to librdkafka as is, for the consumer and the producer both
    /// (connection: `security.protocol`, `sasl.*`, `ssl.*`, `client.id`).
    /// Values are never logged.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// For the consumers only, over `properties` (e.g. `session.timeout.ms`,
    /// `partition.assignment.strategy`, `fetch.*`, `max.poll.interval.ms`).
    /// `partition.assignment.strategy` is `cooperative-sticky` unless set
    /// here (or `group.protocol = "consumer"`, where the broker assigns).
    #[serde(default)]
    pub consumer_properties: BTreeMap<String, String>,
    /// For the producer only (retry and dead-letter writes), over
    /// `properties` (e.g. `linger.ms`, `compression.type`,
    /// `message.timeout.ms`).
    #[serde(default)]
    pub producer_properties: BTreeMap<String, String>,
    /// How often finished offsets are committed (also on revoke and shutdown).
    #[serde(deserialize_with = "human_duration")]
    pub commit_interval: Duration,
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("group_instance_id", &self.group_instance_id)
            .field("topic", &self.topic)
            .field("retry_topic_prefix", &self.retry_topic_prefix)
            .field("retry_tiers", &self.retry_tiers)
            .field("dlq_topic", &self.dlq_topic)
            .field("properties", &redacted(&self.properties))
            .field("consumer_properties", &redacted(&self.consumer_properties))
            .field("producer_properties", &redacted(&self.producer_properties))
            .field("commit_interval", &self.commit_interval)
            .finish()
    }
}

/// One retry topic: records written to it are held `delay` after they were
/// written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTier {
    pub delay: Duration,
    pub topic: String,
}

/// The longest retry tier accepted: a retry partition is held at most this
/// long, which must stay well under the topic's retention (Kafka's default
/// is 7 days).
pub const MAX_RETRY_TIER: Duration = Duration::from_secs(24 * 3600);

impl KafkaSettings {
    /// The retry topics, shortest delay first.
    pub fn retry_tiers(&self) -> Vec<RetryTier> {
        self.retry_tiers
            .iter()
            .map(|&delay| RetryTier {
                delay,
                topic: format!("{}.{}", self.retry_topic_prefix, tier_label(delay)),
            })
            .collect()
    }

    /// librdkafka properties of the consumer: `properties`, then
    /// `consumer_properties` over them.
    ///
    /// No assignor is chosen here: librdkafka's default (`range` first)
    /// gives every replica a share of *each* topic. `cooperative-sticky`
    /// stops fewer partitions on a rebalance but balances the count over
    /// all subscribed topics together, so a replica can end up holding only
    /// retry-tier partitions and none of the jobs topic; the book's "Rebalances
    /// and restarts" (docs/src/deploy/kafka.md) has the measured trade-off.
    pub fn consumer_config(&self) -> BTreeMap<String, String> {
        let mut all = self.properties.clone();
        all.extend(self.consumer_properties.clone());
        all
    }

    /// librdkafka properties of the producer: `properties`, then
    /// `producer_properties` over them.
    pub fn producer_config(&self) -> BTreeMap<String, String> {
        let mut all = self.properties.clone();
        all.extend(self.producer_properties.clone());
        all
    }

    /// Every topic the worker needs: jobs, the retry tiers, dead letters.
    pub fn all_topics(&self) -> Vec<String> {
        let mut topics = vec![self.topic.clone()];
        topics.extend(self.retry_tiers().into_iter().map(|t| t.topic));
        topics.push(self.dlq_topic.clone());
        topics
    }

    /// `(topic, partitions)` for every topic the worker needs, as a local
    /// broker would create them: `partitions` for the jobs topic and each
    /// retry tier (the same count, so a job keeps its partition), one for
    /// the dead-letter topic.
    pub fn topic_specs(&self, partitions: i32) -> Vec<(String, i32)> {
        let mut specs: Vec<(String, i32)> = self
            .all_topics()
            .into_iter()
            .map(|t| (t, partitions))
            .collect();
        if let Some(dlq) = specs.last_mut() {
            dlq.1 = 1;
        }
        specs
    }

    /// Checks that serde's types cannot express.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        error::nonempty(&[
            ("kafka.brokers", &self.brokers),
            ("kafka.group_id", &self.group_id),
            ("kafka.topic", &self.topic),
            ("kafka.retry_topic_prefix", &self.retry_topic_prefix),
            ("kafka.dlq_topic", &self.dlq_topic),
        ])?;
        error::longer_than_zero(&[("kafka.commit_interval", self.commit_interval)])?;
        self.validate_tiers()
    }

    /// Tiers are whole seconds, increasing, each at most [`MAX_RETRY_TIER`].
    fn validate_tiers(&self) -> Result<(), Invalid> {
        let invalid = |problem| Err(Invalid::new("kafka.retry_tiers", problem));
        if self.retry_tiers.is_empty() {
            return invalid(KafkaProblem::NoRetryTiers);
        }
        if self.retry_tiers.windows(2).any(|w| w[1] <= w[0]) {
            return invalid(KafkaProblem::RetryTiersOutOfOrder);
        }
        for &d in &self.retry_tiers {
            if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
                return invalid(KafkaProblem::RetryTierNotWholeSeconds(tier_label(d)));
            }
            if d > MAX_RETRY_TIER {
                return invalid(KafkaProblem::RetryTierTooLong(tier_label(d)));
            }
        }
        Ok(())
    }
}

/// `1m30s`: humantime's form without spaces, fit for a topic name.
pub fn tier_label(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// What is wrong with a value of `[kafka]`.
#[derive(Debug, thiserror::Error)]
pub(super) enum KafkaProblem {
    #[error("must name at least one delay, e.g. [\"1m\"]")]
    NoRetryTiers,
    #[error("delays must be in increasing order")]
    RetryTiersOutOfOrder,
    /// The tier, as [`tier_label`] writes it.
    #[error("{0} is not a whole number of seconds of at least 1s")]
    RetryTierNotWholeSeconds(String),
    #[error(
        "{0} is longer than {max}: a retry partition is held for the longest tier, which must stay well under the topic's retention",
        max = tier_label(MAX_RETRY_TIER)
    )]
    RetryTierTooLong(String),
}
