//! A downstream that answers with absurd or unreadable `Retry-After` values
//! must not crash the worker (issue 6, defect 3: `Retry-After:
//! 10000000000000000000` overflowed `Instant + Duration` and panicked every
//! replica that took the job, a poison pill).

use std::sync::Arc;
use std::time::Duration;

use crate::common::rule;
use crate::common::worker::{job, policy, Arrival, Bench, Downstream, Running};
use axum::http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_absurd_retry_after_is_clamped_and_the_worker_keeps_going() {
    let bench = Bench::new("hostile-ra", 2);
    let down = Downstream::start(Arc::new(|a: &Arrival, earlier| {
        match (a.seller.as_str(), earlier) {
            ("huge", 0) => (
                StatusCode::TOO_MANY_REQUESTS,
                Some("10000000000000000000".into()),
            ),
            ("garbage", 0) => (StatusCode::TOO_MANY_REQUESTS, Some("soon, maybe".into())),
            ("past", 0) => (
                StatusCode::TOO_MANY_REQUESTS,
                Some("Wed, 21 Oct 2015 07:28:00 GMT".into()),
            ),
            _ => (StatusCode::OK, None),
        }
    }))
    .await;
    let mut settings = bench.settings(&down.url);
    settings.downstream.max_retry_after = Duration::from_secs(2);
    bench
        .produce(&[
            job("h-1", "huge"),
            job("g-1", "garbage"),
            job("p-1", "past"),
        ])
        .await;
    let w = Running::start(settings, policy(vec![rule("gcra", 1000, "1s", None)]));
    down.wait_for("every job called twice", Duration::from_secs(20), |a| {
        ["h-1", "g-1", "p-1"]
            .iter()
            .all(|id| a.iter().filter(|x| x.job_id == *id).count() >= 2)
    })
    .await;
    assert!(!w.handle.is_finished(), "the worker stopped (panicked?)");
    let gap = |id: &str| {
        let calls: Vec<_> = down
            .arrivals()
            .into_iter()
            .filter(|x| x.job_id == id)
            .collect();
        calls[1].at.duration_since(calls[0].at)
    };
    let (huge, garbage, past) = (gap("h-1"), gap("g-1"), gap("p-1"));
    println!("second call after: huge {huge:?}, garbage {garbage:?}, past date {past:?}");
    assert!(
        huge >= Duration::from_secs(2) && huge < Duration::from_millis(3500),
        "an absurd Retry-After waits downstream.max_retry_after (2 s), waited {huge:?}"
    );
    assert!(
        garbage < Duration::from_secs(2),
        "an unreadable Retry-After waits the backoff (50..400 ms here), waited {garbage:?}"
    );
    assert!(
        past < Duration::from_secs(1),
        "a past date means now, waited {past:?}"
    );
    w.stop().await;
}
