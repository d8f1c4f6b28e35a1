//! The limiter's code is loaded again when a server has lost it: the
//! Functions library after `FUNCTION FLUSH` (a restart without persistence,
//! a cluster master that joined later), the EVAL scripts after `SCRIPT
//! FLUSH`. And a server that cannot run Functions (here: an ACL user without
//! them, as on a Redis older than 7) runs the same decisions as scripts.
//!
//! On a private `redis-server`: FLUSH empties it for every client.

use std::process::Command;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::{policy, rule, T0};
use throttle_worker::config::Topology;
use throttle_worker::limiter::{KeySpace, Limiter, Mode, RedisStore, Request, Scripts};

fn at(seller: &str, t: u64, cost: u64) -> Request<'_> {
    Request {
        seller,
        cost,
        mode: Mode::AllOrNothing,
        dry_run: false,
        at_us: Some(T0 + t),
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn limiter(url: &str, prefix: &str) -> Limiter<RedisStore> {
    let store = RedisStore::connect(url, Duration::from_secs(5))
        .await
        .expect("private redis-server");
    Limiter::new(
        store,
        KeySpace::new(prefix),
        policy(vec![rule("gcra", 5, "1s", None)], vec![]),
        Topology::Single,
    )
}

#[tokio::test]
async fn the_library_is_loaded_again_after_function_flush() {
    let server = RedisServer::start();
    let lim = limiter(&server.url(), "fl").await;
    assert_eq!(lim.store().scripts(), Scripts::Functions);
    let name = lim.store().library().name.clone();
    assert!(
        redis_cli(server.port, &["FUNCTION", "LIST"]).contains(&name),
        "FUNCTION LIST names {name}"
    );
    assert_eq!(lim.check(at("s", 0, 1)).await.unwrap().granted(), 1);
    assert_eq!(redis_cli(server.port, &["FUNCTION", "FLUSH"]), "OK");
    // FCALL now answers "Function not found"; the store loads and retries.
    assert_eq!(lim.check(at("s", 1, 1)).await.unwrap().granted(), 1);
    assert_eq!(redis_cli(server.port, &["FUNCTION", "FLUSH"]), "OK");
    lim.block_at("other", T0, Duration::from_millis(5))
        .await
        .expect("block after FUNCTION FLUSH");
    assert!(redis_cli(server.port, &["FUNCTION", "LIST"]).contains(&name));
    // Still the same state: 2 of 5 taken, then 3 more, then refused.
    for t in 2..5 {
        assert_eq!(lim.check(at("s", t, 1)).await.unwrap().granted(), 1);
    }
    assert_eq!(lim.check(at("s", 5, 1)).await.unwrap().granted(), 0);
}

#[tokio::test]
async fn the_scripts_are_loaded_again_after_script_flush() {
    let server = RedisServer::start();
    let lim = limiter(&server.url(), "sf").await;
    lim.store().use_eval_scripts().await.unwrap();
    assert_eq!(lim.store().scripts(), Scripts::Eval);
    assert_eq!(lim.check(at("s", 0, 1)).await.unwrap().granted(), 1);
    assert_eq!(redis_cli(server.port, &["SCRIPT", "FLUSH"]), "OK");
    // EVALSHA now answers NOSCRIPT; the store must load and retry.
    assert_eq!(lim.check(at("s", 1, 1)).await.unwrap().granted(), 1);
    assert_eq!(redis_cli(server.port, &["SCRIPT", "FLUSH"]), "OK");
    lim.block_at("s", T0, Duration::from_millis(5))
        .await
        .expect("block after SCRIPT FLUSH");
    assert!(
        !redis_cli(server.port, &["INFO", "commandstats"]).contains("cmdstat_fcall"),
        "no FCALL once scripts are chosen"
    );
}

#[tokio::test]
async fn a_server_without_functions_gets_the_same_decisions_as_scripts() {
    let server = RedisServer::start();
    // An ACL user that may run scripts but not load or call Functions.
    let reply = redis_cli(
        server.port,
        &[
            "ACL",
            "SETUSER",
            "old",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-function",
            "-fcall",
        ],
    );
    assert_eq!(reply, "OK");
    let old = limiter(&format!("redis://old:pw@127.0.0.1:{}", server.port), "old").await;
    assert_eq!(old.store().scripts(), Scripts::Eval);
    let new = limiter(&server.url(), "new").await;
    assert_eq!(new.store().scripts(), Scripts::Functions);
    // The same arrivals, on each path: the same answers.
    for t in 0..12u64 {
        let cost = 1 + t % 3;
        let a = old.check(at("s", t * 90_000, cost)).await.unwrap();
        let b = new.check(at("s", t * 90_000, cost)).await.unwrap();
        assert_eq!(a, b, "step {t}");
    }
    let a = old.acquire_jobs("j", &[2, 1, 3, 1]).await.unwrap();
    let b = new.acquire_jobs("j", &[2, 1, 3, 1]).await.unwrap();
    assert_eq!(
        std::mem::discriminant(&a),
        std::mem::discriminant(&b),
        "{a:?} / {b:?}"
    );
}
