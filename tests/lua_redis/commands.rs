//! The Redis commands the limiter's scripts send (`grep redis.call lua/`),
//! with Redis' replies and errors: string values, integer replies, nil for
//! an absent value, `(` exclusive score bounds and `-inf`/`+inf`, sorted
//! sets ordered by score then member, key expiry on the clock a command is
//! run at. Any other command, or an option the scripts never send, is an
//! error: the embedded Redis must not answer what it does not implement.

use std::collections::HashMap;

use super::keyspace::{Keyspace, Value, ZSet};

/// A hash's fields and values.
type Hash = HashMap<Vec<u8>, Vec<u8>>;

/// A command's reply, as Redis sends it (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Error(String),
    Array(Vec<Reply>),
}

/// Why a command failed; the texts are Redis' own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("ERR unknown command '{0}' (the embedded Redis runs only the commands of lua/)")]
    Unknown(String),
    #[error("ERR option {option} of '{command}' is not implemented by the embedded Redis")]
    Unsupported { command: String, option: String },
    #[error("ERR wrong number of arguments for '{0}' command")]
    Arity(String),
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    #[error("ERR {0}")]
    Invalid(&'static str),
}

/// Runs one command (`argv[0]` its name, any case) at `now_us` on the
/// server's clock.
pub fn run(keys: &mut Keyspace, now_us: u64, argv: &[Vec<u8>]) -> Result<Reply, CommandError> {
    let Some((name, args)) = argv.split_first() else {
        return Err(CommandError::Arity(String::new()));
    };
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    let now_ms = i64::try_from(now_us / 1000).expect("a clock within i64 ms");
    let arity = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(CommandError::Arity(name.clone()))
        }
    };
    let mut db = Db { keys, now_ms };
    match name.as_str() {
        "get" => arity(args.len() == 1).and_then(|()| db.get(&args[0])),
        "set" => arity(args.len() >= 2).and_then(|()| db.set(args)),
        "del" => arity(!args.is_empty()).map(|()| db.del(args)),
        "hgetall" => arity(args.len() == 1).and_then(|()| db.hgetall(&args[0])),
        "hmget" => arity(args.len() >= 2).and_then(|()| db.hmget(&args[0], &args[1..])),
        "hset" => arity(args.len() >= 3 && args.len() % 2 == 1)
            .and_then(|()| db.hset(&args[0], &args[1..])),
        "hdel" => arity(args.len() >= 2).and_then(|()| db.hdel(&args[0], &args[1..])),
        "hincrby" => arity(args.len() == 3).and_then(|()| db.hincrby(args)),
        "pexpire" => arity(args.len() >= 2).and_then(|()| db.pexpire(args)),
        "pttl" => arity(args.len() == 1).map(|()| db.pttl(&args[0])),
        "time" => arity(args.is_empty()).map(|()| time(now_us)),
        // Only the field the limiter reads, in Redis' layout.
        "info" => arity(args.len() <= 1).map(|()| {
            Reply::Bulk(format!("# Server\r\nrun_id:{}\r\n", db.keys.run_id()).into_bytes())
        }),
        "zadd" => arity(args.len() >= 3 && args.len() % 2 == 1)
            .and_then(|()| db.zadd(&args[0], &args[1..])),
        "zcount" => arity(args.len() == 3).and_then(|()| db.zcount(args)),
        "zscore" => arity(args.len() == 2).and_then(|()| db.zscore(&args[0], &args[1])),
        "zrangebyscore" => arity(args.len() >= 3).and_then(|()| db.zrange(args, false)),
        "zrevrangebyscore" => arity(args.len() >= 3).and_then(|()| db.zrange(args, true)),
        "zrem" => arity(args.len() >= 2).and_then(|()| db.zrem(&args[0], &args[1..])),
        "zremrangebyscore" => arity(args.len() == 3).and_then(|()| db.zremrange(args)),
        _ => Err(CommandError::Unknown(name)),
    }
}

/// `TIME`: seconds and microseconds, as two strings.
fn time(now_us: u64) -> Reply {
    Reply::Array(vec![
        Reply::Bulk((now_us / 1_000_000).to_string().into_bytes()),
        Reply::Bulk((now_us % 1_000_000).to_string().into_bytes()),
    ])
}

/// The keyspace at one instant of the server's clock.
struct Db<'a> {
    keys: &'a mut Keyspace,
    now_ms: i64,
}

impl Db<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Reply, CommandError> {
        match self.keys.get(key, self.now_ms) {
            None => Ok(Reply::Nil),
            Some(Value::Str(v)) => Ok(Reply::Bulk(v.clone())),
            Some(_) => Err(CommandError::WrongType),
        }
    }

    /// `SET key value [EX s | PX ms] [NX | XX]`: a new value drops the
    /// old expiry.
    fn set(&mut self, args: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let (key, value) = (&args[0], &args[1]);
        let (mut expires, mut nx, mut xx) = (None, false, false);
        let mut opts = args[2..].iter();
        while let Some(opt) = opts.next() {
            match upper(opt).as_str() {
                unit @ ("EX" | "PX") => {
                    let n = opts
                        .next()
                        .ok_or(CommandError::Invalid("syntax error"))
                        .and_then(|v| integer(v))?;
                    if n <= 0 || expires.is_some() {
                        return Err(CommandError::Invalid(
                            "invalid expire time in 'set' command",
                        ));
                    }
                    let ms = if unit == "EX" {
                        n.saturating_mul(1000)
                    } else {
                        n
                    };
                    expires = Some(self.now_ms.saturating_add(ms));
                }
                "NX" => nx = true,
                "XX" => xx = true,
                other => {
                    return Err(CommandError::Unsupported {
                        command: "set".to_owned(),
                        option: other.to_owned(),
                    })
                }
            }
        }
        if nx && xx {
            return Err(CommandError::Invalid("syntax error"));
        }
        let exists = self.keys.get(key, self.now_ms).is_some();
        if (nx && exists) || (xx && !exists) {
            return Ok(Reply::Nil);
        }
        self.keys.put(key, Value::Str(value.clone()), expires);
        Ok(Reply::Status("OK".to_owned()))
    }

    fn del(&mut self, keys: &[Vec<u8>]) -> Reply {
        let gone = keys
            .iter()
            .filter(|k| self.keys.delete(k, self.now_ms))
            .count();
        Reply::Int(gone as i64)
    }

    /// The hash at `key`: `None` when there is no key.
    fn hash(&mut self, key: &[u8]) -> Result<Option<&mut Hash>, CommandError> {
        match self.keys.get_mut(key, self.now_ms) {
            None => Ok(None),
            Some(Value::Hash(h)) => Ok(Some(h)),
            Some(_) => Err(CommandError::WrongType),
        }
    }

    /// The hash at `key`, made when there is none.
    fn hash_or_new(&mut self, key: &[u8]) -> Result<&mut Hash, CommandError> {
        match self
            .keys
            .get_or_insert(key, self.now_ms, || Value::Hash(Default::default()))
        {
            Value::Hash(h) => Ok(h),
            _ => Err(CommandError::WrongType),
        }
    }

    /// Every field and value. Redis answers a small hash in the order its
    /// fields were written and a large one in its table's order; no script
    /// reads an order (a hash's fields are unique, `lua/common.lua` scans
    /// for one), so here they are sorted, the same on every run.
    fn hgetall(&mut self, key: &[u8]) -> Result<Reply, CommandError> {
        let Some(h) = self.hash(key)? else {
            return Ok(Reply::Array(Vec::new()));
        };
        let mut fields: Vec<(&Vec<u8>, &Vec<u8>)> = h.iter().collect();
        // Sorted, so that a run replays exactly (a HashMap's order is not).
        fields.sort();
        Ok(Reply::Array(
            fields
                .into_iter()
                .flat_map(|(f, v)| [Reply::Bulk(f.clone()), Reply::Bulk(v.clone())])
                .collect(),
        ))
    }

    fn hmget(&mut self, key: &[u8], fields: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let h = self.hash(key)?;
        Ok(Reply::Array(
            fields
                .iter()
                .map(|f| {
                    h.as_ref()
                        .and_then(|h| h.get(f))
                        .map_or(Reply::Nil, |v| Reply::Bulk(v.clone()))
                })
                .collect(),
        ))
    }

    fn hset(&mut self, key: &[u8], pairs: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let h = self.hash_or_new(key)?;
        let new = pairs
            .chunks(2)
            .filter(|p| h.insert(p[0].clone(), p[1].clone()).is_none())
            .count();
        Ok(Reply::Int(new as i64))
    }

    fn hdel(&mut self, key: &[u8], fields: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let Some(h) = self.hash(key)? else {
            return Ok(Reply::Int(0));
        };
        let gone = fields.iter().filter(|f| h.remove(*f).is_some()).count();
        self.keys.drop_if_empty(key);
        Ok(Reply::Int(gone as i64))
    }

    fn hincrby(&mut self, args: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let by = integer(&args[2])?;
        let h = self.hash_or_new(&args[0])?;
        let old = match h.get(&args[1]) {
            None => 0,
            Some(v) => {
                integer(v).map_err(|_| CommandError::Invalid("hash value is not an integer"))?
            }
        };
        let new = old.checked_add(by).ok_or(CommandError::Invalid(
            "increment or decrement would overflow",
        ))?;
        h.insert(args[1].clone(), new.to_string().into_bytes());
        Ok(Reply::Int(new))
    }

    /// `PEXPIRE key ms`: an expiry at or before now deletes the key.
    fn pexpire(&mut self, args: &[Vec<u8>]) -> Result<Reply, CommandError> {
        if let Some(opt) = args.get(2) {
            return Err(CommandError::Unsupported {
                command: "pexpire".to_owned(),
                option: upper(opt),
            });
        }
        let ms = integer(&args[1])?;
        let at = self.now_ms.saturating_add(ms);
        if self.keys.get(&args[0], self.now_ms).is_none() {
            return Ok(Reply::Int(0));
        }
        if at <= self.now_ms {
            self.keys.delete(&args[0], self.now_ms);
        } else {
            self.keys.set_expiry(&args[0], self.now_ms, at);
        }
        Ok(Reply::Int(1))
    }

    fn pttl(&mut self, key: &[u8]) -> Reply {
        Reply::Int(match self.keys.expiry(key, self.now_ms) {
            None => -2,
            Some(None) => -1,
            Some(Some(at)) => (at - self.now_ms).max(0),
        })
    }

    /// The sorted set at `key`: `None` when there is no key.
    fn zset(&mut self, key: &[u8]) -> Result<Option<&mut ZSet>, CommandError> {
        match self.keys.get_mut(key, self.now_ms) {
            None => Ok(None),
            Some(Value::ZSet(z)) => Ok(Some(z)),
            Some(_) => Err(CommandError::WrongType),
        }
    }

    fn zadd(&mut self, key: &[u8], pairs: &[Vec<u8>]) -> Result<Reply, CommandError> {
        // Every score is read before anything is written, as Redis does.
        let mut scored = Vec::with_capacity(pairs.len() / 2);
        for p in pairs.chunks(2) {
            let score = match float(&p[0]) {
                Ok(score) => score,
                // An option (NX, GT, CH, ...) where a score should be.
                Err(_) if p[0].iter().all(u8::is_ascii_alphabetic) => {
                    return Err(CommandError::Unsupported {
                        command: "zadd".to_owned(),
                        option: upper(&p[0]),
                    })
                }
                Err(e) => return Err(e),
            };
            scored.push((score, &p[1]));
        }
        let z = match self
            .keys
            .get_or_insert(key, self.now_ms, || Value::ZSet(ZSet::default()))
        {
            Value::ZSet(z) => z,
            _ => return Err(CommandError::WrongType),
        };
        let added = scored.into_iter().filter(|(s, m)| z.insert(*s, m)).count();
        Ok(Reply::Int(added as i64))
    }

    fn zcount(&mut self, args: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let range = Range::parse(&args[1], &args[2])?;
        let n = self.zset(&args[0])?.map_or(0, |z| {
            z.entries().iter().filter(|(s, _)| range.holds(*s)).count()
        });
        Ok(Reply::Int(n as i64))
    }

    /// `ZSCORE key member`: its score, or nil.
    fn zscore(&mut self, key: &[u8], member: &[u8]) -> Result<Reply, CommandError> {
        let score = self.zset(key)?.and_then(|z| {
            z.entries()
                .iter()
                .find(|(_, m)| m.as_slice() == member)
                .map(|(s, _)| *s)
        });
        Ok(score.map_or(Reply::Nil, |s| Reply::Bulk(format_double(s).into_bytes())))
    }

    /// `Z[REV]RANGEBYSCORE key from to [WITHSCORES] [LIMIT offset count]`
    /// (`from` is the max when reversed).
    fn zrange(&mut self, args: &[Vec<u8>], rev: bool) -> Result<Reply, CommandError> {
        let range = if rev {
            Range::parse(&args[2], &args[1])?
        } else {
            Range::parse(&args[1], &args[2])?
        };
        let (mut scores, mut offset, mut count) = (false, 0i64, -1i64);
        let mut opts = args[3..].iter();
        while let Some(opt) = opts.next() {
            match upper(opt).as_str() {
                "WITHSCORES" => scores = true,
                "LIMIT" => {
                    let (Some(o), Some(c)) = (opts.next(), opts.next()) else {
                        return Err(CommandError::Invalid("syntax error"));
                    };
                    (offset, count) = (integer(o)?, integer(c)?);
                }
                _ => return Err(CommandError::Invalid("syntax error")),
            }
        }
        let Some(z) = self.zset(&args[0])? else {
            return Ok(Reply::Array(Vec::new()));
        };
        if offset < 0 {
            return Ok(Reply::Array(Vec::new()));
        }
        let hits = z.entries().iter().filter(|(s, _)| range.holds(*s));
        let ordered: Box<dyn Iterator<Item = &(f64, Vec<u8>)>> = if rev {
            Box::new(hits.rev())
        } else {
            Box::new(hits)
        };
        let take = usize::try_from(count).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for (s, m) in ordered.skip(offset as usize).take(take) {
            out.push(Reply::Bulk(m.clone()));
            if scores {
                out.push(Reply::Bulk(format_double(*s).into_bytes()));
            }
        }
        Ok(Reply::Array(out))
    }

    fn zrem(&mut self, key: &[u8], members: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let Some(z) = self.zset(key)? else {
            return Ok(Reply::Int(0));
        };
        let gone = members.iter().filter(|m| z.remove(m)).count();
        self.keys.drop_if_empty(key);
        Ok(Reply::Int(gone as i64))
    }

    fn zremrange(&mut self, args: &[Vec<u8>]) -> Result<Reply, CommandError> {
        let range = Range::parse(&args[1], &args[2])?;
        let Some(z) = self.zset(&args[0])? else {
            return Ok(Reply::Int(0));
        };
        let gone = z.remove_where(|s| range.holds(s));
        self.keys.drop_if_empty(&args[0]);
        Ok(Reply::Int(gone as i64))
    }
}

/// A score range: each bound inclusive unless written `(x`.
struct Range {
    min: f64,
    min_open: bool,
    max: f64,
    max_open: bool,
}

impl Range {
    fn parse(min: &[u8], max: &[u8]) -> Result<Range, CommandError> {
        let bound = |b: &[u8]| -> Result<(f64, bool), CommandError> {
            let (open, text) = match b.split_first() {
                Some((b'(', rest)) => (true, rest),
                _ => (false, b),
            };
            float(text)
                .map(|x| (x, open))
                .map_err(|_| CommandError::Invalid("min or max is not a float"))
        };
        let ((min, min_open), (max, max_open)) = (bound(min)?, bound(max)?);
        Ok(Range {
            min,
            min_open,
            max,
            max_open,
        })
    }

    fn holds(&self, s: f64) -> bool {
        let above = if self.min_open {
            s > self.min
        } else {
            s >= self.min
        };
        let below = if self.max_open {
            s < self.max
        } else {
            s <= self.max
        };
        above && below
    }
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

/// An integer argument as Redis reads one (`string2ll`): an optional
/// `-`, digits, no leading zero, no sign `+`, no spaces, within i64.
pub fn integer(b: &[u8]) -> Result<i64, CommandError> {
    let bad = CommandError::Invalid("value is not an integer or out of range");
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0')
        && b != b"-0";
    if !canonical {
        return Err(bad);
    }
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(bad)
}

/// A score as Redis reads one (`strtod`, whole string): decimals,
/// exponents, `inf`, `+inf`, `-inf`; never NaN.
fn float(b: &[u8]) -> Result<f64, CommandError> {
    let bad = CommandError::Invalid("value is not a valid float");
    let s = std::str::from_utf8(b).map_err(|_| bad.clone())?;
    if s.is_empty() || s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace) {
        return Err(bad);
    }
    let x: f64 = s.parse().map_err(|_| bad.clone())?;
    if x.is_nan() {
        return Err(bad);
    }
    Ok(x)
}

/// A double as Redis 7.0 writes one, in replies (a score) and for a Lua
/// number passed to `redis.call`: C's `%.17g` (`inf`/`-inf` for the
/// infinities).
pub fn format_double(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // %.17g: 17 significant digits; scientific when the exponent is
    // below -4 or at least 17; trailing zeros (and a bare point) dropped.
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes an integer exponent");
    if !(-4..17).contains(&exp) {
        let m = trim_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let decimals = usize::try_from(16 - exp).expect("exp < 17");
    trim_zeros(&format!("{x:.decimals$}")).to_owned()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}
