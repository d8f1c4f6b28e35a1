//! `redis.state` left unset (`limiter::layout`): a new install runs v2, an
//! install with an older release's v1 state stays on v1, the marker a
//! worker writes keeps the install's layout, and an explicit setting always
//! wins. Against the real Redis, as a worker's start does it.

mod common;

use common::{raw, store, unique_prefix};
use throttle_worker::limiter::layout::{marker_key, resolve};
use throttle_worker::limiter::{KeySpace, StateLayout};

async fn marker(prefix: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(marker_key(prefix))
        .query_async(&mut raw().await)
        .await
        .expect("GET the marker")
}

#[tokio::test]
async fn a_new_install_runs_v2_and_keeps_it() {
    let store = store().await;
    let prefix = unique_prefix("layout-new");
    // The operator commands read, and write nothing.
    assert_eq!(
        resolve(&store, &prefix, None, false).await.unwrap(),
        StateLayout::V2
    );
    assert_eq!(marker(&prefix).await, None);
    // A worker's start writes what it runs.
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V2
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v2"));
    // State of the v1 layout appearing later (a replica set to v1 by
    // hand) does not move an unset replica off the marker.
    let v1_block = KeySpace::new(prefix.clone()).block("s");
    let _: () = redis::cmd("SET")
        .arg(&v1_block)
        .arg(1)
        .arg("EX")
        .arg(60)
        .query_async(&mut raw().await)
        .await
        .unwrap();
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V2
    );
    let _: () = redis::cmd("DEL")
        .arg(marker_key(&prefix))
        .query_async(&mut raw().await)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_older_install_stays_on_v1_until_set_otherwise() {
    let store = store().await;
    let prefix = unique_prefix("layout-old");
    // An older release's state: a rule key, no marker.
    let rule_key = format!("{prefix}:{{s}}:fixed_window:30:10000000:30");
    let _: () = redis::cmd("HSET")
        .arg(&rule_key)
        .arg("n")
        .arg(3)
        .query_async(&mut raw().await)
        .await
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(&rule_key)
        .arg(60)
        .query_async(&mut raw().await)
        .await
        .unwrap();
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V1
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v1"));
    // The rolling deploy sets v1+v2 explicitly: it wins, and is recorded.
    let mixed = Some(StateLayout::V1V2);
    assert_eq!(
        resolve(&store, &prefix, mixed, true).await.unwrap(),
        StateLayout::V1V2
    );
    assert_eq!(marker(&prefix).await.as_deref(), Some("v1+v2"));
    // A replica left unset follows the install.
    assert_eq!(
        resolve(&store, &prefix, None, true).await.unwrap(),
        StateLayout::V1V2
    );
    let _: () = redis::cmd("DEL")
        .arg(marker_key(&prefix))
        .query_async(&mut raw().await)
        .await
        .unwrap();
}
