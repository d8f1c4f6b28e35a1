//! `throttle-worker demo`: the whole pipeline on one machine, with nothing
//! but a Redis: the mock Kafka broker and the downstream stub in this
//! process, N worker replicas as child processes of this binary (a real
//! consumer group), a Zipf-skewed load with a few malformed records, a live
//! view, and at the end a summary that checks the limits held and nothing
//! was lost.
//!
//! - [`plan`]: the sellers, their roles and rules, the replicas' config.
//! - [`replicas`]: the child processes, which never outlive the demo.
//! - [`scrape`]: the replicas' `/metrics`, parsed and summed.
//! - [`dlq`]: the dead-letter topic, followed and read to its end.
//! - [`check`]: busiest windows against the rules; every job accounted for.
//! - [`run`]: one run from start to stop: broker, stub, replicas, load,
//!   live view, drain; [`summary`]: the checks and the text at the end.
//! - [`view`]: the live view (ratatui, or a plain table).
//! - [`limiter`]: `throttle-worker limiter demo`, the limiter alone.

pub mod check;
pub mod dlq;
pub mod limiter;
pub mod plan;
pub mod replicas;
mod run;
pub mod scrape;
mod summary;
pub mod view;

pub use limiter::limiter_demo;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::ConfigError;
use crate::dev::stub::StubError;
use crate::kafka::{MockError, ReaderError, SinkError};
use crate::limiter::{RedisError, RedisStore};

use self::dlq::FinishError;
use self::run::{Run, STOP_GRACE};
use self::view::View;

/// Why the demo failed or stopped before its summary; `main` prints it
/// with its causes. A variant's text says what the demo was doing, its
/// cause is the source; the transparent ones pass on a cause whose own
/// text says enough.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(
        "--duration must be between 10s and 1h (the group takes seconds to form), got {}",
        humantime::format_duration(*.0)
    )]
    Duration(Duration),
    #[error("--replicas must be between 1 and 16, got {0}")]
    Replicas(usize),
    #[error("--sellers must be between 1 and 1000, got {0}")]
    Sellers(usize),
    #[error("--rate must be between 1 and 5000 jobs/s, got {0}")]
    Rate(f64),
    /// The text names the cause already: not its source too, or `main`
    /// would print it twice.
    #[error("the demo needs Redis: {0}; start one (e.g. `scripts/with-redis.sh throttle-worker demo`) or point REDIS_URL at one")]
    NoRedis(RedisError),
    #[error("a scratch directory for the replicas' configs and logs")]
    Scratch(#[source] std::io::Error),
    #[error("the demo's log file")]
    LogFile(#[source] std::io::Error),
    /// The built-in defaults refused: a bug in the crate, not the user's.
    #[error(transparent)]
    Defaults(ConfigError),
    #[error("the in-process Kafka broker")]
    Broker(#[source] MockError),
    #[error(transparent)]
    Stub(#[from] StubError),
    #[error("a free loopback port")]
    FreePort(#[source] std::io::Error),
    /// The address of a socket just bound: not seen to fail.
    #[error(transparent)]
    PortAddr(std::io::Error),
    #[error("writing {}", .path.display())]
    WriteConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Loading it, or its `[limits]`.
    #[error("the demo's worker config")]
    WorkerConfig(#[source] ConfigError),
    #[error("the demo's worker config names other topics than the broker has: {0:?}")]
    OtherTopics(Vec<(String, i32)>),
    #[error("reading the dead-letter topic")]
    DlqStart(#[source] ReaderError),
    #[error("the load's Kafka producer")]
    Producer(#[source] SinkError),
    #[error("the path of this binary")]
    CurrentExe(#[source] std::io::Error),
    #[error("starting {} run --config ...", .exe.display())]
    Spawn {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("replica {n} exited at startup ({status}); the end of {}:\n{tail}", .log.display())]
    ReplicaExited {
        n: usize,
        status: ExitStatus,
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    #[error("only {ready} of {replicas} replicas were ready (in the group, Redis answering) after {after:?}; see replica-*.log")]
    NotReady {
        ready: usize,
        replicas: usize,
        after: Duration,
    },
    /// The user quit the live view, or SIGTERM / Ctrl-C.
    #[error("interrupted: the replicas were stopped; no summary")]
    Interrupted,
    /// The load's task panicked.
    #[error(transparent)]
    LoadTask(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Load(SinkError),
    #[error("reading the dead-letter topic to its end")]
    DlqFinish(#[source] FinishError),
    /// The summary's failed checks, one a line.
    #[error("the demo's checks failed:\n  - {}", .0.join("\n  - "))]
    ChecksFailed(Vec<String>),
}

/// `throttle-worker demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How long the live phase lasts; the load runs for its first two
    /// thirds, the rest shows the throttled backlogs draining.
    #[arg(long, default_value = "45s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Worker replicas (child processes of this binary).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Sellers in the load (Zipf-skewed: seller-0 sends the most).
    #[arg(long, default_value_t = 12)]
    pub sellers: usize,
    /// Jobs per second the load produces.
    #[arg(long, default_value_t = 300.0)]
    pub rate: f64,
    /// The Redis the replicas' limiter uses (`scripts/with-redis.sh`
    /// starts one if none answers).
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// Keep the replicas' configs and logs even when every check holds
    /// (they are kept anyway when one fails).
    #[arg(long)]
    pub keep_logs: bool,
    /// Proof that the checks can fail: the stub records every call of this
    /// seller twice, as if the limiter had let twice the calls through.
    #[arg(long, hide = true)]
    pub fault_double_count: Vec<String>,
    /// Proof that the checks can fail: the stub answers this seller's calls
    /// but forgets them, as if its jobs were lost.
    #[arg(long, hide = true)]
    pub fault_forget: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (write e.g. 45s, 2m)"))
}

impl DemoArgs {
    fn validate(&self) -> Result<(), DemoError> {
        let d = self.duration;
        if d < Duration::from_secs(10) || d > Duration::from_secs(3600) {
            return Err(DemoError::Duration(d));
        }
        if !(1..=16).contains(&self.replicas) {
            return Err(DemoError::Replicas(self.replicas));
        }
        if !(1..=1000).contains(&self.sellers) {
            return Err(DemoError::Sellers(self.sellers));
        }
        if !(self.rate.is_finite() && self.rate >= 1.0 && self.rate <= 5000.0) {
            return Err(DemoError::Rate(self.rate));
        }
        Ok(())
    }
}

/// Runs the demo; `Ok` when every check holds, an error naming each check
/// that failed otherwise. Stops early, with an error, when `shutdown`
/// resolves (SIGTERM, Ctrl-C) or the user quits the live view.
pub async fn run(args: DemoArgs, shutdown: impl Future<Output = ()>) -> Result<(), DemoError> {
    args.validate()?;
    // Redis first: the one thing the demo needs from outside.
    RedisStore::connect(&args.redis_url, Duration::from_secs(3))
        .await
        .map_err(DemoError::NoRedis)?;
    let result = run_logged(args, shutdown).await;
    // Only now: the broker, the stub and the readers are gone, and their
    // last log lines went to the file too.
    crate::telemetry::redirect_logs(None);
    result
}

/// [`run`] once Redis answered; this process's logs go to `demo.log`.
async fn run_logged(args: DemoArgs, shutdown: impl Future<Output = ()>) -> Result<(), DemoError> {
    let mut run = Run::start(args).await?;
    let (stop_tx, mut stop_rx) = mpsc::unbounded_channel();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut view = View::open(stop_tx);
    let body = run.body(&mut view, &mut stop_rx, &mut shutdown).await;
    view.close();
    let outcome = match body {
        Ok(o) => o,
        Err(e) => {
            let stopped = run.replicas.stop(STOP_GRACE).await;
            let clean = stopped
                .iter()
                .filter(|(_, s)| s.is_some_and(|s| s.success()))
                .count();
            println!(
                "{} of {} replicas stopped cleanly; their logs and configs are kept in {}",
                clean,
                stopped.len(),
                run.keep_logs()
            );
            return Err(e);
        }
    };
    let (text, failures) = run.summary(&outcome);
    println!("{text}");
    if !failures.is_empty() || run.args.keep_logs {
        println!("replica logs and configs kept in {}", run.keep_logs());
    }
    if failures.is_empty() {
        return Ok(());
    }
    Err(DemoError::ChecksFailed(failures))
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    /// `main` prints an error's text, then each of its sources: a
    /// context's text names what was done, and its cause comes once, as
    /// the source.
    #[test]
    fn a_context_is_the_text_and_its_cause_the_source() {
        let denied = || std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = DemoError::WriteConfig {
            path: PathBuf::from("/tmp/replica-1.toml"),
            source: denied(),
        };
        assert_eq!(e.to_string(), "writing /tmp/replica-1.toml");
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("denied")
        );
        let e = DemoError::CurrentExe(denied());
        assert_eq!(e.to_string(), "the path of this binary");
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("denied")
        );
    }

    #[test]
    fn messages_read_as_the_user_saw_them() {
        assert_eq!(
            DemoError::Duration(Duration::from_secs(1)).to_string(),
            "--duration must be between 10s and 1h (the group takes seconds to form), got 1s"
        );
        assert_eq!(
            DemoError::ChecksFailed(vec!["one".into(), "two".into()]).to_string(),
            "the demo's checks failed:\n  - one\n  - two"
        );
        // The Redis error is in the text; as a source too, it would be
        // printed twice.
        let e = DemoError::NoRedis(RedisError::Tls {
            file: "ca.pem".into(),
            problem: "missing".into(),
        });
        assert_eq!(
            e.to_string(),
            "the demo needs Redis: Redis TLS file ca.pem: missing; start one (e.g. `scripts/with-redis.sh throttle-worker demo`) or point REDIS_URL at one"
        );
        assert!(e.source().is_none());
    }
}
