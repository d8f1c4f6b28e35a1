//! Logging setup and typed events.
//!
//! - [`events`]: one struct per occurrence that logs and counts in one place
//!   (the [`Event`](events::Event) trait), a file per subsystem; in tests,
//!   `events::capture()` shows what was emitted on the test's thread.
//! - [`every`]: [`Every`], one log line per interval for repeated failures.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`metrics`]: the Prometheus registry and its series.
//! - [`trace`]: a job's W3C trace context carried to the downstream, and
//!   its span exported through OTLP (the only module importing
//!   `opentelemetry*`).
//! - [`traceparent`]: the `traceparent` header parsed and written (pure).
//!
//! A leaf module: it depends on no other module of this crate.

pub mod events;
pub mod every;
pub mod http;
pub mod metrics;
pub mod trace;
pub mod traceparent;

pub use every::Every;

use std::io::Write;
use std::sync::{Arc, RwLock};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber: `RUST_LOG` filters (default `info`),
/// `THROTTLE_LOG_FORMAT=json` switches to one JSON object per line. Lines
/// go to stderr unless [`redirect_logs`] names a file.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("THROTTLE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(LogSink);
    // try_init: a second call (tests) keeps the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Where log lines go instead of stderr; `None`: stderr.
static REDIRECT: RwLock<Option<Arc<std::fs::File>>> = RwLock::new(None);

/// Sends this process's log lines to `file` from now on (`None`: back to
/// stderr). The demo does this while its live view owns the terminal, so
/// that no log line (its own, or librdkafka's through the `log` bridge)
/// lands in the middle of the table.
pub fn redirect_logs(file: Option<std::fs::File>) {
    let mut r = REDIRECT.write().unwrap_or_else(|p| p.into_inner());
    *r = file.map(Arc::new);
}

/// The subscriber's writer: stderr, or the file of [`redirect_logs`].
struct LogSink;

enum LogWriter {
    Stderr(std::io::Stderr),
    File(Arc<std::fs::File>),
}

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            LogWriter::Stderr(e) => e.write(buf),
            LogWriter::File(f) => (&**f).write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            LogWriter::Stderr(e) => e.flush(),
            LogWriter::File(f) => (&**f).flush(),
        }
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> LogWriter {
        let r = REDIRECT.read().unwrap_or_else(|p| p.into_inner());
        match r.as_ref() {
            Some(f) => LogWriter::File(f.clone()),
            None => LogWriter::Stderr(std::io::stderr()),
        }
    }
}
