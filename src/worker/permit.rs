//! What the worker asks the limiter, and the one place where a limiter
//! failure (Redis down, timed out) becomes a decision.

use std::future::Future;
use std::time::Duration;

use crate::limiter::{Decision, Denied, DeniedBy, Limiter, Mode, Store};

/// The limiter as the worker sees it.
pub trait Permits: Send + Sync + 'static {
    /// Up to `n` units for `seller` (grant up to N: one call releases as
    /// much of a waiting backlog as the rules allow).
    fn acquire(
        &self,
        seller: &str,
        n: u64,
    ) -> impl Future<Output = Result<Decision, String>> + Send;

    /// Holds `seller` for every replica for `dur` (the downstream's 429).
    fn block(&self, seller: &str, dur: Duration)
        -> impl Future<Output = Result<(), String>> + Send;
}

impl<S: Store + 'static> Permits for Limiter<S> {
    async fn acquire(&self, seller: &str, n: u64) -> Result<Decision, String> {
        Limiter::acquire(self, seller, n, Mode::UpTo)
            .await
            .map_err(|e| e.to_string())
    }

    async fn block(&self, seller: &str, dur: Duration) -> Result<(), String> {
        Limiter::block(self, seller, dur)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// What a limiter failure means. Only fail-closed exists today; fail-open
/// and a local share of the limit slot in here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimiterError {
    /// Treat the seller as refused and ask again after `hold`: no job passes
    /// unchecked, the backlog waits.
    FailClosed { hold: Duration },
}

impl OnLimiterError {
    pub const DEFAULT: OnLimiterError = OnLimiterError::FailClosed {
        hold: Duration::from_millis(500),
    };

    /// The decision to act on when the limiter could not answer.
    pub fn decide(self) -> Decision {
        match self {
            OnLimiterError::FailClosed { hold } => Decision::Denied(Denied {
                retry_after: hold,
                remaining: 0,
                reset_after: hold,
                by: DeniedBy::Unavailable,
                decided_at_us: 0,
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OnLimiterError::FailClosed { .. } => "fail_closed",
        }
    }
}
