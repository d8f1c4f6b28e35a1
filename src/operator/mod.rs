//! The operator commands behind `throttle-worker limits …` and
//! `check-config`: each returns its output as text, a table for people or
//! JSON (`--json`) for scripts, and `main` prints it.
//!
//! They read the same config as the workers and talk to the same Redis, so
//! what they show is what every replica enforces: the config's limits with
//! the temporary overrides in force.
//!
//! - `mod.rs` (here): [`OperatorError`], [`Output`], and what every command
//!   starts from: the config loaded as a worker would ([`load`]) and the
//!   limiter it describes ([`open_limiter`]).
//! - `seller.rs`: one seller's state, charging nothing: `limits show`,
//!   `limits peek`; and `limits reset`, which clears it.
//! - `overrides.rs`: `limits override` (set, `--clear`) and `limits list`.
//! - `pauses.rs`: `limits pause`, `limits resume`, and the pauses in force
//!   that `show` and `list` print.
//! - `check.rs`: `check-config`.
//! - `confirm.rs`: [`confirm`], the `--yes` or `Proceed? [y/N]` a
//!   fleet-wide action needs (`limits reset`, `limits pause --all`, an
//!   unfiltered `dlq replay`).
//! - `exit.rs`: [`ExitCode`], the exit codes of every command.
//! - `end.rs`: [`End`], when a pause or an override ends (`--for`, `--until`).
//! - `format.rs`: tables, times, durations and rules as both outputs write them.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{self, Settings};
use crate::limiter::{KeySpace, Limiter, Policy, RedisStore};

mod check;
pub mod confirm;
mod end;
mod exit;
mod format;
mod overrides;
mod pauses;
mod seller;

pub use check::check_config;
pub use confirm::{confirm, confirm_here, Confirmed, Declined};
pub use end::{end, End};
pub use exit::ExitCode;
pub use overrides::{clear_override, list, set_override};
pub use pauses::{pause, resume};
pub use seller::{peek, reset, show};

/// Why an operator command failed; `main` prints it with its cause.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("invalid configuration")]
    Config(#[source] config::ConfigError),
    #[error(transparent)]
    Redis(#[from] crate::limiter::RedisError),
    #[error(transparent)]
    Limiter(#[from] crate::limiter::LimiterError<crate::limiter::RedisError>),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("--for")]
    For(#[source] humantime::DurationError),
    #[error("--until")]
    Until(#[source] humantime::TimestampError),
    #[error("give --for DURATION or --until TIME")]
    NoEnd,
    #[error("it would end before it starts")]
    EndsBeforeStart,
    #[error("--rule {0}")]
    Rule(String),
}

/// How a command prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// Loads and validates the config, as a worker would at start.
pub fn load(file: Option<&Path>) -> Result<(Settings, Policy), OperatorError> {
    load_noting(file).map(|(settings, policy, _)| (settings, policy))
}

/// [`load`], with the old key names the config used.
pub fn load_noting(
    file: Option<&Path>,
) -> Result<(Settings, Policy, Vec<config::Deprecation>), OperatorError> {
    let loaded = config::load(file).map_err(OperatorError::Config)?;
    let policy = Policy::load(&loaded).map_err(OperatorError::Config)?;
    Ok((loaded.settings, policy, loaded.deprecations))
}

/// The limiter as the worker sees it: the config's policy with the
/// overrides in force now.
pub async fn open_limiter(file: Option<&Path>) -> Result<Limiter<RedisStore>, OperatorError> {
    let (settings, policy) = load(file)?;
    let store = RedisStore::open(&settings.redis).await?;
    let prefix = &settings.redis.key_prefix;
    let limiter = Limiter::new(
        store,
        KeySpace::new(prefix.clone()),
        policy,
        settings.redis.topology,
    );
    limiter.refresh_overrides().await?;
    Ok(limiter)
}

/// This host's clock in Unix ms, for what `show` and `list` read; the
/// commands that set an end take Redis' clock, which the replicas judge by.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
