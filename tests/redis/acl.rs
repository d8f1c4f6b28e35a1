//! The Redis user the book gives the workers (issue 11): created with the
//! book's own `ACL SETUSER` line on a private `redis-server`, it can do
//! everything a worker and the operator commands do (limiter calls, job
//! lists, a 429 block, overrides, a reset), and no more: a key outside the
//! prefix is refused, and so is a wrong password, without the password in
//! the error.


use std::process::Command;

use crate::common::redis_server::RedisServer;
use crate::common::rule;
use throttle_worker::config::{load_from, Topology};
use throttle_worker::limiter::overrides::Override;
use throttle_worker::limiter::{
    BatchDecision, Decision, KeySpace, Limiter, Mode, RedisStore,
};

const PASSWORD: &str = "acl-s3cret-Pw";

/// The book's ACL line (docs/src/deploy/redis.md), with the password and
/// the key prefix of the test.
fn readme_acl(prefix: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/deploy/redis.md"
    ))
    .expect("docs/src/deploy/redis.md");
    let start = readme.find("<!-- redis-acl:start -->").expect("ACL marker");
    let end = readme
        .find("<!-- redis-acl:end -->")
        .expect("ACL end marker");
    let line = readme[start..end]
        .lines()
        .find(|l| l.starts_with("ACL SETUSER"))
        .expect("an ACL SETUSER line");
    line.split_whitespace()
        .map(|w| match w {
            ">CHANGE-ME" => format!(">{PASSWORD}"),
            "~tw:*" => format!("~{prefix}:*"),
            other => other.to_owned(),
        })
        .collect()
}

fn redis_cli(port: u16, args: &[String]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn open(port: u16, password: &str, prefix: &str) -> Result<RedisStore, String> {
    let env = vec![
        (
            "THROTTLE__REDIS__URL".to_owned(),
            format!("redis://throttle-worker:{password}@127.0.0.1:{port}"),
        ),
        ("THROTTLE__REDIS__KEY_PREFIX".to_owned(), prefix.to_owned()),
        ("THROTTLE__REDIS__TIMEOUT".to_owned(), "2s".to_owned()),
    ];
    let settings = load_from(None, env).unwrap().settings;
    RedisStore::open(&settings.redis)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_readme_acl_user_runs_the_worker_and_nothing_more() {
    let server = RedisServer::start();
    let prefix = "twacl";
    let reply = redis_cli(server.port, &readme_acl(prefix));
    assert_eq!(reply, "OK", "ACL SETUSER from the book: {reply}");

    let store = open(server.port, PASSWORD, prefix)
        .await
        .expect("the ACL user connects and loads the scripts");
    assert_eq!(
        store.scripts(),
        throttle_worker::limiter::Scripts::Functions,
        "the book's user may load and call the Functions library"
    );
    let policy = crate::common::policy(
        vec![
            rule("sliding_window_log", 3, "1m", None),
            rule("token_bucket", 10, "1s", Some(5)),
        ],
        vec![rule("gcra", 100, "1s", None)],
    );
    let limiter = Limiter::new(
        store.clone(),
        KeySpace::new(prefix),
        policy.clone(),
        Topology::Single,
    );
    limiter_commands(&limiter).await;

    // Nothing more: keys outside the prefix are refused...
    let outside = Limiter::new(
        open(server.port, PASSWORD, prefix).await.unwrap(),
        KeySpace::new("elsewhere"),
        crate::common::policy(vec![rule("gcra", 10, "1s", None)], vec![]),
        Topology::Single,
    );
    let e = outside
        .acquire("s", 1, Mode::AllOrNothing)
        .await
        .expect_err("a key outside ~twacl:* must be refused");
    assert!(
        e.to_string().contains("NOPERM") || e.to_string().contains("no permissions"),
        "{e}"
    );
    // ...and so is a wrong password, without the password in the error.
    let Err(e) = open(server.port, "wrong-password-xyz", prefix).await else {
        panic!("a wrong password must be refused");
    };
    assert!(
        !e.contains("wrong-password-xyz"),
        "the error shows the password: {e}"
    );
    assert!(!e.contains(PASSWORD), "{e}");
}

/// What a worker and the operator commands do with Redis, through `limiter`.
async fn limiter_commands(limiter: &Limiter<RedisStore>) {
    // Limiter calls: single, job lists, a refusal.
    for _ in 0..3 {
        let d = limiter.acquire("s", 1, Mode::AllOrNothing).await.unwrap();
        assert!(matches!(d, Decision::Granted(_)), "{d:?}");
    }
    let d = limiter.acquire("s", 1, Mode::AllOrNothing).await.unwrap();
    assert!(matches!(d, Decision::Denied(_)), "{d:?}");
    let b = limiter.acquire_jobs("t", &[2, 2]).await.unwrap();
    assert!(
        matches!(b, BatchDecision::Granted(ref g) if g.jobs == 1),
        "{b:?}"
    );
    // A downstream 429 shared through Redis.
    limiter
        .block("u", std::time::Duration::from_secs(5))
        .await
        .unwrap();
    let d = limiter.acquire("u", 1, Mode::AllOrNothing).await.unwrap();
    assert!(matches!(d, Decision::Denied(_)), "{d:?}");
    // Overrides: written by the operator command, read by every worker.
    let o = Override {
        algorithm: "gcra".into(),
        limit: 9,
        period_ms: 1000,
        burst: None,
        until_ms: u64::MAX / 2,
    };
    let key = limiter.keys().overrides();
    limiter
        .store()
        .set_field(&key, "v", &o.to_json())
        .await
        .unwrap();
    assert_eq!(limiter.refresh_overrides().await.unwrap(), 1);
    limiter
        .store()
        .delete_fields(&key, &["v".to_owned()])
        .await
        .unwrap();
    // `limits show` and `limits reset`.
    let state = limiter.inspect("s", None).await.unwrap();
    assert_eq!(state.rules[0].remaining, 0);
    limiter
        .store()
        .delete(&limiter.seller_keys("s"))
        .await
        .unwrap();
    let d = limiter.acquire("s", 1, Mode::AllOrNothing).await.unwrap();
    assert!(matches!(d, Decision::Granted(_)), "after the reset: {d:?}");
}
