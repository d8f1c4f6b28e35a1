//! Logging setup and typed events.
//!
//! - [`events`]: one struct per occurrence that logs and counts in one place.
//! - [`every`]: [`Every`], one log line per interval for repeated failures.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`metrics`]: the Prometheus registry and its series.
//!
//! A leaf module: it depends on no other module of this crate.

pub mod events;
pub mod every;
pub mod http;
pub mod metrics;

pub use every::Every;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber: `RUST_LOG` filters (default `info`),
/// `THROTTLE_LOG_FORMAT=json` switches to one JSON object per line.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("THROTTLE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init: a second call (tests) keeps the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
