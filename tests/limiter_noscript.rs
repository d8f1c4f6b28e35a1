//! NOSCRIPT recovery: after `SCRIPT FLUSH` (or a Redis restart) the store
//! loads the scripts again and the call succeeds.
//!
//! A test binary of its own: SCRIPT FLUSH empties the cache for every client
//! of the server, so it must not run beside other limiter tests.

mod common;

use std::time::Duration;

use common::{limiter, policy, raw, rule, unique_prefix, T0};
use throttle_worker::limiter::{Mode, Request};

fn at(seller: &str, t: u64, cost: u64) -> Request<'_> {
    Request {
        seller,
        cost,
        mode: Mode::AllOrNothing,
        dry_run: false,
        at_us: Some(T0 + t),
    }
}

#[tokio::test]
async fn the_script_is_reloaded_after_script_flush() {
    let prefix = unique_prefix("noscript");
    let lim = limiter(&prefix, policy(vec![rule("gcra", 5, "1s", None)], vec![])).await;
    assert_eq!(lim.check(at("s", 0, 1)).await.unwrap().granted(), 1);
    let mut conn = raw().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // EVALSHA now answers NOSCRIPT; the store must load and retry.
    assert_eq!(lim.check(at("s", 1, 1)).await.unwrap().granted(), 1);
    // The block script too.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    lim.block_at("s", T0, Duration::from_millis(5))
        .await
        .expect("block after SCRIPT FLUSH");
}
