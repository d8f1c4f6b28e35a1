//! The simulation's embedded Redis (`tests/lua_redis/`) held to a real
//! one: the same random cases as `agreement.rs` (rules of every algorithm,
//! costs, times, edits, refunds, blocks, cancels, slots, losses under a
//! loss guard) run on Redis and on the embedded
//! Redis, which must reply the very same integers at every step, with the
//! scripts run as a Functions library (FCALL, the simulation's) and as
//! EVAL scripts. Both sides run the same Lua, so a difference is the
//! emulation's: a command's reply, an expiry, a conversion. Then a few
//! cases of the emulated commands alone.

use std::time::{SystemTime, UNIX_EPOCH};

use throttle_worker::limiter::{BlockAt, JobsCall, JobsReply, RefundCall};

use super::agreement::{agree_on_random_sequences_with, Twin};
use crate::lua_redis::{EmbeddedRedis, Mode, Reply};

/// The embedded Redis on the wall clock, as the real one's: the cases'
/// explicit times decide, the wall clock only expires keys and answers
/// `TIME` (neither of which a reply shows within a case's milliseconds).
/// `FCALL`: the scripts run as a Functions library (what the product
/// runs on the real Redis here, 7+), else as EVAL scripts.
struct Embedded<const FCALL: bool>(EmbeddedRedis);

fn wall_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    u64::try_from(since.as_micros()).expect("µs fit in u64")
}

impl<const FCALL: bool> Twin for Embedded<FCALL> {
    const NAME: &'static str = if FCALL {
        "embedded (FCALL)"
    } else {
        "embedded (EVAL)"
    };

    fn fresh() -> Self {
        let mode = if FCALL { Mode::Functions } else { Mode::Eval };
        Embedded(EmbeddedRedis::new(mode).unwrap_or_else(|e| panic!("embedded Redis: {e}")))
    }

    fn refund(&mut self, call: &RefundCall) -> Result<u64, String> {
        self.0.refund(call, wall_us()).map_err(|e| e.to_string())
    }

    fn run_jobs(&mut self, call: &JobsCall) -> Result<(Vec<JobsReply>, Option<i128>), String> {
        // As RedisStore with an explicit time: no record life sent.
        let answer = self
            .0
            .run_jobs(call, None, wall_us())
            .map_err(|e| e.to_string())?;
        let epoch = match &call.guard {
            None => None,
            Some(g) => match self.0.command(&["GET", &g.epoch], wall_us()) {
                Ok(Reply::Bulk(b)) => Some(
                    String::from_utf8_lossy(&b)
                        .parse()
                        .map_err(|e| format!("the epoch {b:?}: {e}"))?,
                ),
                Ok(Reply::Nil) => None,
                other => return Err(format!("GET {}: {other:?}", g.epoch)),
            },
        };
        Ok((answer.replies, epoch))
    }

    fn release(&mut self, key: &str, leases: &[String]) -> Result<u64, String> {
        self.0
            .release(key, leases, wall_us())
            .map_err(|e| e.to_string())
    }

    fn cancel(&mut self, call: &JobsCall) -> Result<Vec<i64>, String> {
        // With an explicit time RedisStore sends no life: neither does
        // `cancel_wire_args`, whatever is given here.
        self.0
            .cancel_jobs(call, 0, wall_us())
            .map_err(|e| e.to_string())
    }

    fn block(&mut self, at: &BlockAt, now_us: u64, dur_us: u64) -> Result<u64, String> {
        self.0
            .block(at, Some(now_us), dur_us, wall_us())
            .map_err(|e| e.to_string())
    }

    fn set_epoch(&mut self, key: &str, at_us: u64) {
        self.0
            .command(&["SET", key, &at_us.to_string()], wall_us())
            .unwrap_or_else(|e| panic!("SET {key}: {e}"));
    }
}

#[test]
fn redis_and_embedded_functions_agree_on_random_sequences() {
    agree_on_random_sequences_with::<Embedded<true>>();
}

#[test]
fn redis_and_embedded_eval_agree_on_random_sequences() {
    agree_on_random_sequences_with::<Embedded<false>>();
}

// ---------------------------------------------------------------------------
// The emulated commands alone

const MS: u64 = 1_000;
/// A clock reading far from zero, as Redis' is.
const T: u64 = 1_793_491_200_000_000;

fn server() -> EmbeddedRedis {
    EmbeddedRedis::new(Mode::Eval).unwrap_or_else(|e| panic!("embedded Redis: {e}"))
}

fn cmd(r: &EmbeddedRedis, at_us: u64, argv: &[&str]) -> Reply {
    r.command(argv, at_us)
        .unwrap_or_else(|e| panic!("{argv:?} at {at_us}: {e}"))
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

fn bulks(items: &[&str]) -> Reply {
    Reply::Array(items.iter().map(|s| bulk(s)).collect())
}

/// Keys expire on the clock they are run at, as Redis' do: alive at the
/// instant of their expiry, gone the ms after (`now > when`).
#[test]
fn keys_expire_on_the_given_clock() {
    let r = server();
    // 1. SET PX: alive through its last ms.
    cmd(&r, T, &["SET", "k", "v", "PX", "1000"]);
    assert_eq!(cmd(&r, T + 400 * MS, &["PTTL", "k"]), Reply::Int(600), "1");
    assert_eq!(
        cmd(&r, T + 1000 * MS, &["GET", "k"]),
        bulk("v"),
        "1: at expiry"
    );
    assert_eq!(
        cmd(&r, T + 1001 * MS, &["GET", "k"]),
        Reply::Nil,
        "1: after"
    );
    assert_eq!(cmd(&r, T + 1001 * MS, &["PTTL", "k"]), Reply::Int(-2), "1");
    // 2. A hash with PEXPIRE; a SET drops a string's expiry.
    cmd(&r, T, &["HSET", "h", "a", "1"]);
    assert_eq!(
        cmd(&r, T, &["PTTL", "h"]),
        Reply::Int(-1),
        "2: no expiry yet"
    );
    assert_eq!(cmd(&r, T, &["PEXPIRE", "h", "50"]), Reply::Int(1), "2");
    assert_eq!(
        cmd(&r, T + 51 * MS, &["HGETALL", "h"]),
        bulks(&[]),
        "2: gone"
    );
    cmd(&r, T, &["SET", "s", "1", "PX", "10"]);
    cmd(&r, T, &["SET", "s", "2"]);
    assert_eq!(
        cmd(&r, T + 20 * MS, &["GET", "s"]),
        bulk("2"),
        "2: SET keeps no TTL"
    );
    // 3. PEXPIRE of a missing key, and one at or before now deletes.
    assert_eq!(cmd(&r, T, &["PEXPIRE", "none", "10"]), Reply::Int(0), "3");
    assert_eq!(cmd(&r, T, &["PEXPIRE", "s", "0"]), Reply::Int(1), "3");
    assert_eq!(cmd(&r, T, &["GET", "s"]), Reply::Nil, "3: deleted at once");
    // 4. TIME reads the clock, in a script too; the clock is frozen there.
    let time = r
        .eval_source("return redis.call('TIME')", &[], &[], T + 1_234_567)
        .expect("4: TIME");
    assert_eq!(time, bulks(&["1793491201", "234567"]), "4");
}

/// Score bounds: `(` exclusive, `-inf`/`+inf`; equal scores ordered by
/// member, reversed by ZREVRANGEBYSCORE; LIMIT after the bounds; a set
/// emptied by ZREM or ZREMRANGEBYSCORE is gone.
#[test]
fn sorted_sets_bound_and_order_as_redis() {
    let r = server();
    let z = |argv: &[&str]| cmd(&r, T, argv);
    assert_eq!(
        z(&["ZADD", "z", "1", "a", "2", "c", "2", "b", "3", "d"]),
        Reply::Int(4)
    );
    assert_eq!(
        z(&["ZADD", "z", "2", "a"]),
        Reply::Int(0),
        "a moved, not added"
    );
    // 1. (1 excludes nothing at 1 now; a, b, c at 2 and d at 3.
    assert_eq!(z(&["ZCOUNT", "z", "(1", "3"]), Reply::Int(4), "1");
    assert_eq!(z(&["ZCOUNT", "z", "(2", "+inf"]), Reply::Int(1), "1");
    assert_eq!(z(&["ZCOUNT", "z", "-inf", "(3"]), Reply::Int(3), "1");
    // 2. Ordered by score then member, with scores and a LIMIT.
    assert_eq!(
        z(&[
            "ZRANGEBYSCORE",
            "z",
            "2",
            "+inf",
            "WITHSCORES",
            "LIMIT",
            "1",
            "2"
        ]),
        bulks(&["b", "2", "c", "2"]),
        "2"
    );
    assert_eq!(
        z(&[
            "ZREVRANGEBYSCORE",
            "z",
            "+inf",
            "(2",
            "WITHSCORES",
            "LIMIT",
            "0",
            "1"
        ]),
        bulks(&["d", "3"]),
        "2: reversed"
    );
    assert_eq!(
        z(&["ZREVRANGEBYSCORE", "z", "2", "-inf"]),
        bulks(&["c", "b", "a"]),
        "2: equal scores reversed by member"
    );
    // 3. Removal, and the key gone with its last member.
    assert_eq!(
        z(&["ZREMRANGEBYSCORE", "z", "-inf", "2"]),
        Reply::Int(3),
        "3"
    );
    assert_eq!(z(&["ZREM", "z", "d", "x"]), Reply::Int(1), "3");
    assert_eq!(r.keys(T), Vec::<String>::new(), "3: the empty set is gone");
    // 4. Scores as Redis writes them: integers whole, others %.17g.
    z(&["ZADD", "y", "1793491200000000", "t", "0.1", "f"]);
    assert_eq!(
        z(&["ZRANGEBYSCORE", "y", "-inf", "+inf", "WITHSCORES"]),
        bulks(&["f", "0.10000000000000001", "t", "1793491200000000"]),
        "4"
    );
}

/// Redis' conversions at a script's return and at `redis.call`'s
/// arguments and reply.
#[test]
fn values_convert_as_redis_converts_them() {
    let r = server();
    let eval = |src: &str| r.eval_source(src, &["k"], &[], T);
    // 1. Numbers truncate; false is nil; an array ends at its first nil.
    assert_eq!(
        eval("return {1, 2.9, -2.9, false, 5, nil, 7}").expect("1"),
        Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(2),
            Reply::Int(-2),
            Reply::Nil,
            Reply::Int(5)
        ]),
        "1"
    );
    // 2. A Lua number reaches Redis as %.17g, not Lua's %.14g.
    assert_eq!(
        eval("redis.call('SET', KEYS[1], 1793491200000001); return redis.call('GET', KEYS[1])")
            .expect("2"),
        bulk("1793491200000001"),
        "2"
    );
    // 3. A missing value is false; a status reply a table.
    assert_eq!(
        eval("return {redis.call('GET', 'none') == false and 1 or 0, redis.call('SET', 'x', 'y').ok}")
            .expect("3"),
        Reply::Array(vec![Reply::Int(1), bulk("OK")]),
        "3"
    );
    // 4. struct round-trips a double and says where it stopped.
    assert_eq!(
        eval(
            "local s = struct.pack('>d', 2^53 - 1) .. struct.pack('>d', 3); \
              local x, at = struct.unpack('>d', s, 9); return {x, at, #s}"
        )
        .expect("4"),
        Reply::Array(vec![Reply::Int(3), Reply::Int(17), Reply::Int(16)]),
        "4"
    );
}

/// What the emulation does not implement, or a script gets wrong, fails
/// the call: never a quiet default.
#[test]
fn what_is_not_emulated_fails_loudly() {
    let r = server();
    for (n, src, says) in [
        (
            1,
            "return redis.call('INCR', 'k')",
            "unknown command 'incr'",
        ),
        (
            2,
            "return redis.call('HSET', 'k', 'f')",
            "wrong number of arguments for 'hset'",
        ),
        (
            3,
            "return redis.call('ZADD', 'k', '1')",
            "wrong number of arguments for 'zadd'",
        ),
        (
            4,
            "return redis.call('ZADD', 'k', 'NX', '1')",
            "option NX of 'zadd'",
        ),
        (
            5,
            "return redis.call('PEXPIRE', 'k', '10', 'GT')",
            "option GT of 'pexpire'",
        ),
        (
            6,
            "return undefined_global",
            "nonexistent global variable 'undefined_global'",
        ),
        (7, "made_global = 1", "create global variable 'made_global'"),
        (8, "return struct.pack('>i', 1)", "struct format option 'i'"),
        (
            9,
            "return struct.unpack('>d', 'short', 1)",
            "data string too short",
        ),
        (
            10,
            "return redis.error_reply('EXPIRED late')",
            "EXPIRED late",
        ),
        (
            11,
            "return redis.call('SET', 'k', {})",
            "must be strings or integers",
        ),
    ] {
        let got = r.eval_source(src, &[], &[], T);
        let err = got.expect_err(&format!("{n}: {src} must fail")).to_string();
        assert!(err.contains(says), "{n}: {src}: {err}");
    }
    // A command on a key of another type is Redis' WRONGTYPE.
    cmd(&r, T, &["SET", "s", "1"]);
    let err = r.command(&["HGETALL", "s"], T).expect_err("WRONGTYPE");
    assert!(err.to_string().starts_with("WRONGTYPE"), "{err}");
}
