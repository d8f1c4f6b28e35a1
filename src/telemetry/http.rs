//! `/healthz`, `/readyz` and `/metrics` on `http.listen`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

/// Liveness and readiness as the worker reports them.
#[derive(Debug, Clone)]
pub struct Health {
    /// Started, and not yet shutting down.
    ready: Arc<AtomicBool>,
    /// A partition assignment came from the group (possibly empty: a
    /// replica beyond the partition count is joined with nothing to do).
    joined: Arc<AtomicBool>,
    /// Set after `redis.unready_after_failures` failed limiter calls in a row,
    /// cleared by the next success.
    redis_down: Arc<AtomicBool>,
    /// When the worker's event loop last turned (ms since the epoch).
    beat_ms: Arc<AtomicU64>,
    /// A loop silent longer than this is stuck: `/healthz` answers 503.
    stuck_after: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Health {
    /// `stuck_after`: how long the event loop may go without turning; it
    /// turns at least every `kafka.commit_interval`.
    pub fn new(stuck_after: Duration) -> Health {
        Health {
            ready: Arc::default(),
            joined: Arc::default(),
            redis_down: Arc::default(),
            beat_ms: Arc::new(AtomicU64::new(now_ms())),
            stuck_after,
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn set_joined(&self) {
        self.joined.store(true, Ordering::Relaxed);
    }

    pub fn set_redis_down(&self, down: bool) {
        self.redis_down.store(down, Ordering::Relaxed);
    }

    /// The event loop turned.
    pub fn beat(&self) {
        self.beat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// `/healthz`: alive unless the event loop has not turned for
    /// `stuck_after`.
    pub fn live(&self, now_ms: u64) -> Result<(), String> {
        let silent = now_ms.saturating_sub(self.beat_ms.load(Ordering::Relaxed));
        if silent > self.stuck_after.as_millis() as u64 {
            Err(format!(
                "not alive: the worker's event loop has not turned for {} ms",
                silent
            ))
        } else {
            Ok(())
        }
    }

    /// `/readyz`: started, in the group, and Redis answering the limiter.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if !self.ready.load(Ordering::Relaxed) {
            Err("not ready: starting or stopping")
        } else if !self.joined.load(Ordering::Relaxed) {
            Err("not ready: no partition assignment from the consumer group yet")
        } else if self.redis_down.load(Ordering::Relaxed) {
            Err("not ready: Redis does not answer the limiter")
        } else {
            Ok(())
        }
    }
}

/// Binds `addr` and serves in the background; returns the bound address
/// (port 0 picks a free one).
pub async fn serve(addr: SocketAddr, health: Health) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "http server stopped");
        }
    });
    Ok(bound)
}

async fn metrics(State(h): State<Health>) -> impl axum::response::IntoResponse {
    // Readiness as a series, so an alert sees a replica Kubernetes keeps
    // out of its Service (and compose, which has no kube-state-metrics).
    super::metrics::metrics()
        .ready
        .set(i64::from(h.readiness().is_ok()));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        super::metrics::metrics().render(),
    )
}

async fn healthz(State(h): State<Health>) -> (StatusCode, String) {
    match h.live(now_ms()) {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(h): State<Health>) -> (StatusCode, String) {
    match h.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_stops_turning_is_not_alive() {
        let h = Health::new(Duration::from_secs(10));
        let beat = h.beat_ms.load(Ordering::Relaxed);
        assert_eq!(h.live(beat + 9_000), Ok(()));
        let err = h.live(beat + 11_000).unwrap_err();
        assert!(err.contains("has not turned for 11000 ms"), "{err}");
        h.beat();
        assert_eq!(h.live(now_ms()), Ok(()));
    }

    #[test]
    fn ready_takes_the_start_the_group_and_redis() {
        let h = Health::new(Duration::from_secs(10));
        assert!(h.readiness().unwrap_err().contains("starting"));
        h.set_ready(true);
        assert!(h.readiness().unwrap_err().contains("consumer group"));
        h.set_joined();
        assert_eq!(h.readiness(), Ok(()));
        h.set_redis_down(true);
        assert!(h.readiness().unwrap_err().contains("Redis"));
        h.set_redis_down(false);
        assert_eq!(h.readiness(), Ok(()));
    }

    /// The `throttle_ready` line of a scrape through the handler.
    async fn scraped_ready(h: &Health) -> String {
        use axum::response::IntoResponse;
        let body = metrics(State(h.clone())).await.into_response().into_body();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.lines()
            .find(|l| l.starts_with("throttle_ready "))
            .unwrap_or_else(|| panic!("no throttle_ready in:\n{text}"))
            .to_owned()
    }

    #[tokio::test]
    async fn a_scrape_exports_the_readiness_of_that_moment() {
        let h = Health::new(Duration::from_secs(10));
        assert_eq!(scraped_ready(&h).await, "throttle_ready 0");
        h.set_ready(true);
        h.set_joined();
        assert_eq!(scraped_ready(&h).await, "throttle_ready 1");
        h.set_redis_down(true);
        assert_eq!(scraped_ready(&h).await, "throttle_ready 0");
    }
}
