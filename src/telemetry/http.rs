//! `/healthz`, `/readyz` and `/metrics` on `http.listen`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

/// Readiness as the worker reports it.
#[derive(Debug, Clone, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
    /// Set after `redis.unready_after` failed limiter calls in a row,
    /// cleared by the next success.
    redis_down: Arc<AtomicBool>,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn set_redis_down(&self, down: bool) {
        self.redis_down.store(down, Ordering::Relaxed);
    }
}

/// Binds `addr` and serves in the background; returns the bound address
/// (port 0 picks a free one).
pub async fn serve(addr: SocketAddr, health: Health) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|| async { super::events::counters().render() }),
        )
        .with_state(health);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "http server stopped");
        }
    });
    Ok(bound)
}

async fn readyz(State(h): State<Health>) -> (StatusCode, &'static str) {
    if !h.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    } else if h.redis_down.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: Redis does not answer the limiter\n",
        )
    } else {
        (StatusCode::OK, "ready\n")
    }
}
