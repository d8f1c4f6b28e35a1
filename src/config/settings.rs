//! [`Settings`]: every section together, `[http]` (one address, which
//! serde checks), and the check across sections: the producer must carry
//! a copy of the largest job the worker accepts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::error::Invalid;
use super::{
    DownstreamSettings, KafkaSettings, LimitsConfig, RedisSettings, TracingSettings, WorkerSettings,
};

/// All settings of one worker process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub redis: RedisSettings,
    pub downstream: DownstreamSettings,
    pub http: HttpSettings,
    pub worker: WorkerSettings,
    pub limits: LimitsConfig,
    pub tracing: TracingSettings,
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Address of /metrics, /healthz and /readyz.
    pub listen: SocketAddr,
}

/// What a retry or dead-letter copy adds to a job's value: its key and the
/// worker's headers (`x-error` is at most 1 KiB), with room to spare.
pub const COPY_OVERHEAD_BYTES: usize = 64 * 1024;

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 300_000;

/// librdkafka's ceiling for `message.max.bytes`.
const LIBRDKAFKA_MAX_MESSAGE_BYTES: usize = 1_000_000_000;

impl Settings {
    /// The largest record the worker copies to a retry tier or the
    /// dead-letter topic: a job of `worker.max_payload_bytes` with its key
    /// and headers (never below librdkafka's default of 1,000,000).
    pub fn max_copy_bytes(&self) -> usize {
        self.worker
            .max_payload_bytes
            .saturating_add(COPY_OVERHEAD_BYTES)
            .max(1_000_000)
    }

    /// The producer's librdkafka properties: `kafka.properties` and
    /// `kafka.producer_properties`, with `message.max.bytes` sized to carry
    /// the largest job the worker accepts unless set there. (librdkafka's
    /// default, 1,000,000, is below the default `worker.max_payload_bytes`:
    /// a job near the limit could never be retried.)
    pub fn producer_config(&self) -> BTreeMap<String, String> {
        let mut all = self.kafka.producer_config();
        all.entry("message.max.bytes".to_owned())
            .or_insert_with(|| self.max_copy_bytes().to_string());
        all
    }

    /// The longest a revoke waits for its partitions' calls under way
    /// (`worker.revoke_wait`): by default `downstream.timeout`, by when
    /// every call under way has ended, and at most half of
    /// `max.poll.interval.ms` (the wait holds the next poll back).
    pub fn revoke_wait(&self) -> Duration {
        let cap = self.max_poll_interval() / 2;
        self.worker
            .revoke_wait
            .unwrap_or_else(|| self.downstream.timeout.min(cap))
    }

    /// The consumers' `max.poll.interval.ms`, librdkafka's default (300 s)
    /// unless set.
    fn max_poll_interval(&self) -> Duration {
        let k = &self.kafka;
        let set = k
            .consumer_properties
            .get("max.poll.interval.ms")
            .or_else(|| k.properties.get("max.poll.interval.ms"));
        let ms = set
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_MAX_POLL_INTERVAL_MS);
        Duration::from_millis(ms)
    }

    /// `worker.revoke_wait`, if set: above zero and below
    /// `max.poll.interval.ms`.
    fn validate_revoke_wait(&self) -> Result<(), Invalid> {
        let Some(wait) = self.worker.revoke_wait else {
            return Ok(());
        };
        super::error::longer_than_zero(&[("worker.revoke_wait", wait)])?;
        let max_poll = self.max_poll_interval();
        if wait >= max_poll {
            return Err(Invalid::new(
                "worker.revoke_wait",
                RevokeProblem::OverPollInterval {
                    max_poll_ms: max_poll.as_millis() as u64,
                },
            ));
        }
        Ok(())
    }

    /// Checks that serde's types cannot express: each section's, then
    /// those across sections.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        self.kafka.validate()?;
        self.redis.validate()?;
        self.downstream.validate()?;
        self.worker.validate()?;
        self.tracing.validate()?;
        self.limits.validate(self.downstream.timeout)?;
        self.validate_revoke_wait()?;
        self.validate_copy_size()
    }

    /// `message.max.bytes`, if set by hand, must carry the largest job.
    fn validate_copy_size(&self) -> Result<(), Invalid> {
        let need = self.max_copy_bytes();
        if need > LIBRDKAFKA_MAX_MESSAGE_BYTES {
            return Err(Invalid::new(
                "worker.max_payload_bytes",
                CopyProblem::OverLibrdkafkaLimit { need },
            ));
        }
        let k = &self.kafka;
        let set = [
            (
                "kafka.producer_properties",
                k.producer_properties.get("message.max.bytes"),
            ),
            ("kafka.properties", k.properties.get("message.max.bytes")),
        ];
        let Some((key, value)) = set.into_iter().find_map(|(key, v)| v.map(|v| (key, v))) else {
            return Ok(());
        };
        let Ok(bytes) = value.trim().parse::<usize>() else {
            return Err(Invalid::new(
                key,
                CopyProblem::MaxBytesNotANumber(value.clone()),
            ));
        };
        if bytes < need {
            let payload = self.worker.max_payload_bytes;
            return Err(Invalid::new(
                key,
                CopyProblem::MaxBytesBelowCopy {
                    bytes,
                    payload,
                    need,
                },
            ));
        }
        Ok(())
    }
}

/// What is wrong with `worker.revoke_wait`.
#[derive(Debug, thiserror::Error)]
pub(super) enum RevokeProblem {
    #[error("must be below max.poll.interval.ms ({max_poll_ms} ms): the revoke's wait holds the consumer's next poll back, and a consumer that does not poll within it leaves the group")]
    OverPollInterval { max_poll_ms: u64 },
}

/// What is wrong with the size of a copy to a retry tier or the
/// dead-letter topic.
#[derive(Debug, thiserror::Error)]
pub(super) enum CopyProblem {
    #[error(
        "with {overhead} bytes for a copy's key and headers, the largest record would be {need} bytes, over librdkafka's limit of {max}",
        overhead = COPY_OVERHEAD_BYTES,
        max = LIBRDKAFKA_MAX_MESSAGE_BYTES
    )]
    OverLibrdkafkaLimit { need: usize },
    /// The value as written.
    #[error("message.max.bytes = {0:?} is not a whole number of bytes")]
    MaxBytesNotANumber(String),
    #[error(
        "message.max.bytes = {bytes} is below worker.max_payload_bytes ({payload}) plus {overhead} bytes for a copy's key and headers: a job near the payload limit could never be copied to a retry tier or the dead-letter topic; set it to at least {need} or leave it unset (the worker sizes it)",
        overhead = COPY_OVERHEAD_BYTES
    )]
    MaxBytesBelowCopy {
        bytes: usize,
        payload: usize,
        need: usize,
    },
}
