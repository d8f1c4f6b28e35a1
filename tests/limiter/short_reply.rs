//! A jobs reply shorter than its call's requests (issue 51, part 6:
//! `jobs.rs` expected an answer per list while `reply.rs` never checked
//! the reply's length, so a short reply panicked the caller). Now it is an
//! error for every list of the call, and what the script charged is given
//! back, as for a reply lost on the way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{policy, rule, store, unique_prefix};
use throttle_worker::config::Topology;
use throttle_worker::limiter::{
    BatchDecision, BlockAt, JobsCall, JobsReply, KeySpace, Limiter, LimiterError, RedisError,
    RedisStore, RefundCall, Store,
};

/// Redis, except that a jobs call's reply loses its last entry.
#[derive(Clone)]
struct Short {
    inner: RedisStore,
    cancels: Arc<AtomicUsize>,
}

impl Store for Short {
    type Error = RedisError;

    async fn refund(&self, call: &RefundCall) -> Result<u64, RedisError> {
        self.inner.refund(call).await
    }

    async fn run_jobs(&self, call: &JobsCall) -> Result<Vec<JobsReply>, RedisError> {
        let mut replies = self.inner.run_jobs(call).await?;
        replies.pop();
        Ok(replies)
    }

    async fn release(&self, key: &str, leases: &[String]) -> Result<u64, RedisError> {
        self.inner.release(key, leases).await
    }

    async fn cancel_jobs(&self, call: &JobsCall) -> Result<Vec<i64>, RedisError> {
        self.cancels.fetch_add(1, Ordering::SeqCst);
        self.inner.cancel_jobs(call).await
    }

    async fn block(
        &self,
        at: &BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> Result<u64, RedisError> {
        self.inner.block(at, now_us, dur_us).await
    }
}

#[tokio::test]
async fn a_short_reply_fails_every_list_of_its_call_and_charges_nothing() {
    let prefix = unique_prefix("short-reply");
    let keys = || KeySpace::new(prefix.clone());
    let rules = || policy(vec![rule("fixed_window", 5, "1h", None)], vec![]);
    let short = Short {
        inner: store().await,
        cancels: Arc::new(AtomicUsize::new(0)),
    };
    let cancels = short.cancels.clone();
    let limiter = Limiter::new(short, keys(), rules(), Topology::Single);
    let lists: [(&str, &[u64]); 3] = [("a", &[1, 1]), ("b", &[1]), ("c", &[1, 1, 1])];
    // Panicked before: "every list is answered: refused above or decided".
    let answers = limiter.check_jobs_many(&lists, false, None).await;
    assert_eq!(answers.len(), 3);
    for (i, a) in answers.iter().enumerate() {
        let e = a
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("list {i}: a short reply must fail every list, got {a:?}"));
        assert!(
            matches!(**e, LimiterError::ShortReply { sent: 3, got: 2 }),
            "list {i}: {e}"
        );
    }
    // A single list's short reply (no reply at all) is the same error.
    let one = limiter.acquire_jobs("d", &[1]).await;
    assert!(
        matches!(one, Err(LimiterError::ShortReply { sent: 1, got: 0 })),
        "{one:?}"
    );
    // What the script charged is given back: each seller has its 5 again.
    let plain = Limiter::new(store().await, keys(), rules(), Topology::Single);
    let deadline = Instant::now() + Duration::from_secs(5);
    for seller in ["a", "b", "c", "d"] {
        loop {
            let peek = plain
                .check_jobs(throttle_worker::limiter::JobsQuery {
                    seller,
                    costs: &[1; 5],
                    dry_run: true,
                    at_us: None,
                })
                .await
                .expect("a dry run");
            match peek {
                BatchDecision::Granted(g) if g.jobs == 5 => break,
                other => assert!(
                    Instant::now() < deadline,
                    "{seller}: still charged 5 s after the short reply: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(cancels.load(Ordering::SeqCst), 2, "one cancel per call");
}
