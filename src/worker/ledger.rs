//! The handoff ledger in Redis ([`crate::kafka::ledger`]): one hash per
//! consumer group, `{key_prefix}:{handoff}:{group}`, a field per partition
//! (`topic|partition`), kept 7 days after its last write.
//!
//! The consumer calls it on its poll thread, inside rebalance callbacks,
//! so each call waits at most [`LEDGER_TIMEOUT`]: a slow Redis delays a
//! commit by that much, never a rebalance for longer. After a failure the
//! ledger is left alone for [`LEDGER_QUIET`], so a Redis that hangs costs
//! the poll thread one wait per quiet period, not one per commit.

use std::time::Duration;

use crate::kafka::ledger::{self, Entry, Ledger, LedgerError};
use crate::kafka::offsets::Commit;
use crate::limiter::RedisStore;

/// The longest one read or write waits.
pub const LEDGER_TIMEOUT: Duration = Duration::from_millis(500);

/// How long the ledger is not asked after a failure.
pub const LEDGER_QUIET: Duration = Duration::from_secs(5);

/// How long a group's ledger lives after its last write: far longer than
/// any rebalance, short enough that a deleted group's ledger goes.
pub const LEDGER_LIFE: Duration = Duration::from_secs(7 * 24 * 3600);

pub struct RedisLedger {
    store: RedisStore,
    key: String,
    runtime: tokio::runtime::Handle,
    /// Not asked before then: Redis failed the last call.
    quiet_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl RedisLedger {
    /// A ledger on `store` for `group`; call inside the runtime whose
    /// connections `store` uses.
    pub fn new(store: RedisStore, prefix: &str, group: &str) -> RedisLedger {
        RedisLedger {
            store,
            key: key(prefix, group),
            runtime: tokio::runtime::Handle::current(),
            quiet_until: std::sync::Mutex::new(None),
        }
    }

    /// Runs `f` to its end or [`LEDGER_TIMEOUT`], from the consumer's
    /// thread (never a runtime's: it would block the runtime).
    fn wait<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, crate::limiter::RedisError>>,
    ) -> Result<T, LedgerError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(LedgerError(
                "called on the async runtime; the ledger is the poll thread's".to_owned(),
            ));
        }
        let now = std::time::Instant::now();
        let mut quiet = self.quiet_until.lock().unwrap_or_else(|p| p.into_inner());
        if quiet.is_some_and(|until| now < until) {
            return Err(LedgerError(format!(
                "not asked: Redis failed less than {LEDGER_QUIET:?} ago"
            )));
        }
        let result = match self
            .runtime
            .block_on(async { tokio::time::timeout(LEDGER_TIMEOUT, f).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(LedgerError(e.to_string())),
            Err(_) => Err(LedgerError(format!(
                "Redis did not answer within {LEDGER_TIMEOUT:?}"
            ))),
        };
        *quiet = result.is_err().then(|| now + LEDGER_QUIET);
        result
    }
}

/// The ledger's key for `group` under `prefix`.
pub fn key(prefix: &str, group: &str) -> String {
    format!("{prefix}:{{handoff}}:{group}")
}

impl Ledger for RedisLedger {
    fn write(&self, commits: &[Commit]) -> Result<(), LedgerError> {
        let fields: Vec<(String, String)> = commits
            .iter()
            .map(|c| (ledger::field(&c.topic, c.partition), Entry::of(c).encode()))
            .collect();
        self.wait(self.store.set_hash_fields(&self.key, &fields, LEDGER_LIFE))
    }

    fn read(&self, partitions: &[(String, i32)]) -> Result<Vec<Option<Entry>>, LedgerError> {
        let fields: Vec<String> = partitions
            .iter()
            .map(|(t, p)| ledger::field(t, *p))
            .collect();
        let values = self.wait(self.store.hash_fields(&self.key, &fields))?;
        Ok(values
            .into_iter()
            .map(|v| v.as_deref().and_then(Entry::decode))
            .collect())
    }
}
