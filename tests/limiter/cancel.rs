//! Refund by call id (issue 21, part 5; `lua/calls.lua`): a jobs call whose
//! answer never reached its caller is cancelled, so no seller stays charged
//! for units it was not told it had.
//!
//! - `a_cancel_after_the_call_gives_back_exactly_what_it_charged`: every
//!   algorithm: a charged call cancelled at its own instant
//!   leaves the seller as if it had never been charged (a peek answers as
//!   for an untouched seller); a second cancel gives nothing more.
//! - `a_cancel_before_the_call_makes_it_charge_nothing`: the tombstone.
//! - `a_call_whose_reply_is_lost_is_cancelled`: end to end, through the
//!   production `Limiter` and `Coalescer` over a proxy that lets the call
//!   reach Redis and run but holds its reply past `redis.timeout`: the
//!   caller gets a timeout, and the seller ends up charged nothing.
//!
//! Every step of the first three runs on Redis and on the model
//! (`testkit::run_jobs`, `testkit::cancel`), which must agree.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{policy, raw, redis_url, rule, store, unique_prefix, T0};
use throttle_worker::config::Topology;
use throttle_worker::limiter::local::ModelStore;
use throttle_worker::limiter::testkit;
use throttle_worker::limiter::{
    Algorithm, BatchDecision, CoalesceSettings, Coalescer, JobsCall, JobsQuery, JobsReply,
    JobsRequest, KeySpace, Limiter, RedisStore, Rule, Store,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One rule of `algorithm`: 5 per 10 s, burst 8 where it has one.
fn rule_of(algorithm: Algorithm) -> Rule {
    let burst = algorithm.uses_burst().then_some(8);
    Rule::new(algorithm, 5, Duration::from_secs(10), burst).expect("a valid rule")
}

/// Sellers of one rule set, on Redis and in the model.
struct Bench {
    keys: KeySpace,
    rules: Vec<Rule>,
    redis: RedisStore,
    model: ModelStore,
    what: String,
}

impl Bench {
    async fn new(rules: Vec<Rule>) -> Bench {
        let what = format!("{:?}", rules[0].algorithm());
        Bench {
            keys: KeySpace::new(unique_prefix("cancel")),
            rules,
            redis: store().await,
            model: ModelStore::new(),
            what,
        }
    }

    fn call(&self, seller: &str, id: &str, now_us: u64, costs: &[u64], dry_run: bool) -> JobsCall {
        JobsCall {
            now_us: Some(now_us),
            dry_run,
            guard: None,
            learn: None,
            requests: vec![JobsRequest {
                call_id: id.to_owned(),
                block: self.keys.block_at(seller),
                rules: self.keys.own_rules(seller, &self.rules),
                costs: costs.to_vec(),
                slots: None,
            }],
        }
    }

    /// A jobs call on both sides; the reply when they agree.
    async fn jobs(
        &mut self,
        seller: &str,
        id: &str,
        now_us: u64,
        costs: &[u64],
        dry_run: bool,
    ) -> JobsReply {
        let call = self.call(seller, id, now_us, costs, dry_run);
        let lua = self.redis.run_jobs(&call).await.expect("jobs call");
        let want = testkit::run_jobs(&mut self.model, now_us, dry_run, &call.requests);
        assert_eq!(
            lua, want,
            "{}: jobs {id} at {now_us}: lua ≠ model",
            self.what
        );
        lua[0]
    }

    /// A cancel on both sides; its answer when they agree.
    async fn cancel(&mut self, seller: &str, id: &str, now_us: u64) -> i64 {
        let call = self.call(seller, id, now_us, &[1], false);
        let lua = self.redis.cancel_jobs(&call).await.expect("cancel call");
        let want = testkit::cancel(&mut self.model, now_us, &call.requests);
        assert_eq!(
            lua, want,
            "{}: cancel {id} at {now_us}: lua ≠ model",
            self.what
        );
        lua[0]
    }

    /// What a dry run of unit jobs answers: (jobs, units, remaining).
    async fn peek(&mut self, seller: &str, now_us: u64) -> (i64, i64, i64) {
        let r = self.jobs(seller, "peek", now_us, &[1; 12], true).await;
        (r.jobs, r.head.granted, r.head.remaining)
    }
}

#[tokio::test]
async fn a_cancel_after_the_call_gives_back_exactly_what_it_charged() {
    for algorithm in Algorithm::ALL {
        let mut b = Bench::new(vec![rule_of(algorithm)]).await;
        let fresh = b.peek("untouched", T0).await;
        let r = b.jobs("s", "x", T0, &[2, 1], false).await;
        assert_eq!((r.head.status, r.head.granted), (1, 3), "{}: {r:?}", b.what);
        assert_ne!(b.peek("s", T0).await, fresh, "{}: the call charged", b.what);
        assert_eq!(
            b.cancel("s", "x", T0).await,
            3,
            "{}: the cancel gives back the call's units",
            b.what
        );
        assert_eq!(
            b.peek("s", T0).await,
            fresh,
            "{}: as if never charged",
            b.what
        );
        assert_eq!(
            b.cancel("s", "x", T0).await,
            0,
            "{}: a second cancel gives nothing",
            b.what
        );
        assert_eq!(
            b.peek("s", T0).await,
            fresh,
            "{}: still as if never charged",
            b.what
        );
    }
}

#[tokio::test]
async fn a_cancel_before_the_call_makes_it_charge_nothing() {
    for algorithm in Algorithm::ALL {
        let mut b = Bench::new(vec![rule_of(algorithm)]).await;
        let fresh = b.peek("untouched", T0).await;
        assert_eq!(b.cancel("s", "x", T0).await, -1, "{}: a tombstone", b.what);
        let r = b.jobs("s", "x", T0 + 1_000, &[2, 1], false).await;
        assert_eq!(
            (r.head.status, r.head.granted, r.jobs),
            (0, 0, 0),
            "{}: the cancelled call grants and charges nothing: {r:?}",
            b.what
        );
        assert_eq!(
            b.peek("s", T0 + 1_000).await,
            b.peek("untouched", T0 + 1_000).await,
            "{}",
            b.what
        );
        assert_eq!(
            b.cancel("s", "x", T0 + 2_000).await,
            0,
            "{}: cancelled already",
            b.what
        );
        // Another call of the seller is not touched by the tombstone.
        let r = b.jobs("s", "y", T0 + 3_000, &[2, 1], false).await;
        assert_eq!((r.head.status, r.head.granted), (1, 3), "{}: {r:?}", b.what);
        assert_ne!(b.peek("s", T0 + 3_000).await, fresh, "{}", b.what);
    }
}

/// The records are bounded: a busy seller's hash keeps its newest calls
/// (within `REC_BYTES`: nine of these 8-byte ids), and a record lives
/// `life` (5 s by default). A cancel past either finds nothing: it leaves
/// a tombstone and refunds nothing. Lua and model agree on every step.
#[tokio::test]
async fn a_busy_sellers_records_keep_the_newest_calls_for_their_life() {
    let rule = Rule::new(Algorithm::FixedWindow, 1_000, Duration::from_secs(10), None)
        .expect("a valid rule");
    let mut b = Bench::new(vec![rule]).await;
    for i in 0..120u64 {
        let r = b
            .jobs("s", &format!("call-{i:03}"), T0 + i, &[1], false)
            .await;
        assert_eq!(r.head.status, 1, "{}: {r:?}", b.what);
    }
    let at = T0 + 200;
    for (id, answer, what) in [
        ("call-000", -1, "pushed out"),
        ("call-100", -1, "pushed out by 19 later calls"),
        ("call-119", 1, "the newest"),
        ("call-113", 1, "kept"),
        ("call-113", 0, "cancelled already"),
    ] {
        assert_eq!(b.cancel("s", id, at).await, answer, "{}: {what}", b.what);
    }
    let r = b.jobs("s", "late", at, &[2], false).await;
    assert_eq!(r.head.granted, 2, "{}", b.what);
    let after_life = at + 5_000_000;
    assert_eq!(
        b.cancel("s", "late", after_life).await,
        -1,
        "{}: its life is over",
        b.what
    );
}

/// Call ids as `Limiter` makes them (the replica's random instance, then a
/// counter, in hex).
fn long_id(i: u64) -> String {
    format!("5eedc0ffee5eed42.{i:x}")
}

/// The fields and values of a hash, straight from Redis.
async fn hash_fields(key: &str) -> Vec<(String, String)> {
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut raw().await)
        .await
        .expect("HGETALL")
}

/// Records cost no command of their own (issue 37): they live in the field
/// `rec` of the seller's hash, which every call reads and writes anyway.
/// So the hash must not grow with a busy seller's calls: the field stays
/// within `REC_BYTES` through 300 calls, the hash within that of its size
/// after one call, Lua and model hold the same records, and a call
/// followed by a few of the seller's calls (other replicas' while its
/// cancel is on its way) is still refunded.
#[tokio::test]
async fn a_busy_sellers_records_stay_bounded_in_its_hash() {
    use throttle_worker::limiter::testkit::calls::REC_BYTES;
    let rule = Rule::new(
        Algorithm::Gcra,
        1_000_000,
        Duration::from_secs(1),
        Some(1_000_000),
    )
    .expect("a valid rule");
    let mut b = Bench::new(vec![rule]).await;
    let hash = b.keys.seller_state("s");
    let first = b.jobs("s", &long_id(0), T0, &[3], false).await;
    assert_eq!(first.head.granted, 3, "{}: {first:?}", b.what);
    let bytes = |fields: &[(String, String)]| -> usize {
        fields.iter().map(|(f, v)| f.len() + v.len()).sum()
    };
    let small = bytes(&hash_fields(&hash).await);
    for i in 1..=300u64 {
        let r = b.jobs("s", &long_id(i), T0 + i, &[1], false).await;
        assert_eq!(r.head.status, 1, "{}: {r:?}", b.what);
        let fields = hash_fields(&hash).await;
        let rec = fields
            .iter()
            .find(|(f, _)| f == "rec")
            .map_or("", |(_, v)| v.as_str());
        assert!(rec.len() <= REC_BYTES, "{}: {rec:?}", b.what);
        let model: Vec<String> = testkit::calls::records(&b.model, &hash)
            .iter()
            .map(|(id, at, units)| format!(";{id},{at},{units}"))
            .collect();
        assert_eq!(
            rec,
            model.concat(),
            "{}: after call {i}, lua vs model",
            b.what
        );
        assert!(
            bytes(&fields) <= small + REC_BYTES,
            "{}: the hash grew with the calls: {small} B after one call, {} B after {i}",
            b.what,
            bytes(&fields)
        );
        if i == 3 {
            // The first call, 3 calls later: still refunded.
            assert_eq!(b.cancel("s", &long_id(0), T0 + 4).await, 3, "{}", b.what);
        }
    }
    assert_eq!(
        b.cancel("s", &long_id(300), T0 + 400).await,
        1,
        "{}: the newest",
        b.what
    );
    assert_eq!(
        b.cancel("s", &long_id(200), T0 + 400).await,
        -1,
        "{}: pushed out",
        b.what
    );
}

// ---------------------------------------------------------------------------
// A reply lost after the call ran

/// A TCP proxy in front of Redis that forwards every request at once and
/// holds each reply `delay` before passing it on: a call runs in time, its
/// answer arrives after the caller gave up.
struct SlowReplies {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
}

impl SlowReplies {
    async fn start() -> SlowReplies {
        let url = redis_url();
        let upstream = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .expect("host:port")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("proxy address");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let up = TcpStream::connect(&upstream).await.expect("upstream Redis");
                let (mut client_r, mut client_w) = client.into_split();
                let (mut up_r, mut up_w) = up.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_r, &mut up_w).await;
                });
                let delay = delay.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match up_r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let d = delay.load(Ordering::SeqCst);
                        if d > 0 {
                            tokio::time::sleep(Duration::from_millis(d)).await;
                        }
                        if client_w.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        SlowReplies { addr, delay_ms }
    }

    fn hold_replies(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
}

/// Units a seller could still take now (a dry run, straight to Redis).
async fn room(keys: &KeySpace, policy: &throttle_worker::limiter::Policy, seller: &str) -> u64 {
    let direct = Limiter::new(
        store().await,
        keys.clone(),
        policy.clone(),
        Topology::Single,
    );
    let q = JobsQuery {
        dry_run: true,
        ..JobsQuery::new(seller, &[1; 12])
    };
    match direct.check_jobs(q).await.expect("dry run") {
        BatchDecision::Granted(g) => g.units,
        other => panic!("{seller}: a dry run of a fresh seller: {other:?}"),
    }
}

/// The seller's hash, as the scripts left it.
async fn hash_of(keys: &KeySpace, seller: &str) -> Vec<(String, String)> {
    let mut conn = raw().await;
    redis::cmd("HGETALL")
        .arg(keys.seller_state(seller))
        .query_async(&mut conn)
        .await
        .expect("HGETALL")
}

#[tokio::test]
async fn a_call_whose_reply_is_lost_is_cancelled() {
    let timeout = Duration::from_millis(300);
    let proxy = SlowReplies::start().await;
    let slow = RedisStore::connect(&format!("redis://{}", proxy.addr), timeout)
        .await
        .expect("a store through the proxy");
    let keys = KeySpace::new(unique_prefix("cancel-lost"));
    let policy = policy(vec![rule("fixed_window", 10, "1h", None)], vec![]);
    let limiter = Arc::new(Limiter::new(
        slow,
        keys.clone(),
        policy.clone(),
        Topology::Single,
    ));
    // A first answer teaches the store Redis' clock: the calls below
    // carry their deadline, and run well before it.
    limiter
        .acquire_jobs("warm", &[1])
        .await
        .expect("warm-up call");

    proxy.hold_replies(timeout * 2);
    // The limiter's own call (one seller), then a coalesced call of
    // two sellers (one script call, so one cancel for both).
    let lost = limiter.acquire_jobs("s", &[3]).await;
    assert!(lost.is_err(), "the caller timed out: {lost:?}");
    let coalescer = Coalescer::start(limiter.clone(), CoalesceSettings::default());
    let (a, b) = tokio::join!(
        coalescer.acquire_jobs("c1", &[2, 2]),
        coalescer.acquire_jobs("c2", &[4]),
    );
    assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
    proxy.hold_replies(Duration::ZERO);

    // The cancels go out in the background; give them the time to run.
    tokio::time::sleep(timeout * 4).await;
    for seller in ["s", "c1", "c2"] {
        let hash = hash_of(&keys, seller).await;
        let field = |name: &str| hash.iter().find(|(f, _)| f == name).map(|(_, v)| v.clone());
        // The call ran (its rule's count is there) and was cancelled
        // after (its record is a tombstone, the count back to 0).
        assert_eq!(field("r0:n").as_deref(), Some("0"), "{seller}: {hash:?}");
        let tomb = field("tomb").unwrap_or_default();
        assert!(
            tomb.starts_with(';') && !tomb.contains(";;"),
            "{seller}: the cancel left a tombstone: {hash:?}"
        );
        assert_eq!(
            field("rec").unwrap_or_default(),
            "",
            "{seller}: the record went with its refund"
        );
        assert_eq!(
            room(&keys, &policy, seller).await,
            10,
            "{seller}: charged for units it was never told of ({hash:?})"
        );
    }
    assert_eq!(
        room(&keys, &policy, "warm").await,
        9,
        "the answered call stays charged"
    );
}
