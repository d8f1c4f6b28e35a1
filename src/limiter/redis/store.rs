//! The limiter's calls, [`Store`] on Redis: each runs one entry point of
//! the Lua (see `scripts`), is timed and counted, and hands back the raw
//! reply or the error; a timeout gets a single server's connection
//! replaced. What a failure means is the caller's to decide.

use std::time::Duration;

use crate::limiter::learn::Blocked;
use crate::limiter::reply::{EpochFound, JobsAnswer, JobsReply, MalformedReply, RollbackFound};
use crate::limiter::script::{
    call_life_us, install_args, release_args, BlockAt, BlockCall, JobsCall, RefundCall, RestoreCall,
};
use crate::limiter::shape::Shape;
use crate::limiter::store::Store;
use crate::telemetry::events::{
    LimiterStateLost, LimiterStateRolledBack, LimiterStateStarted, RedisCalled,
};

use super::clock::local_us;
use super::scripts::Entry;
use super::{RedisError, RedisStore};

impl RedisStore {
    /// One call of the limiter: FCALL of the library's function, or EVALSHA
    /// of the script; its flat integer reply.
    async fn invoke<'a>(
        &self,
        keys: impl Iterator<Item = &'a str>,
        args: Vec<String>,
    ) -> Result<Vec<i64>, RedisError> {
        let keys: Vec<&str> = keys.collect();
        let started = std::time::Instant::now();
        let result = self
            .scripts
            .call(&self.conn, Entry::Limiter, &keys, &args)
            .await;
        RedisCalled {
            kind: "script",
            took: started.elapsed(),
            error: result.as_ref().err().map(error_kind),
        }
        .emit();
        result.map_err(|e| self.failed(e))
    }

    /// One jobs call of a generated shape (`limiter::shape`), timed and
    /// counted as [`RedisStore::invoke`]'s; `None` when the general
    /// function must run it.
    async fn invoke_shape(
        &self,
        shape: &Shape,
        call: &JobsCall,
        args: &[String],
    ) -> Option<Result<Vec<i64>, RedisError>> {
        let keys: Vec<&str> = call.keys().collect();
        let started = std::time::Instant::now();
        let result = self
            .scripts
            .call_shape(&self.conn, shape, &keys, args)
            .await?;
        RedisCalled {
            kind: "script",
            took: started.elapsed(),
            error: result.as_ref().err().map(error_kind),
        }
        .emit();
        Some(result.map_err(|e| self.failed(e)))
    }

    /// A failed call: a timeout gets a single server's connection replaced.
    fn failed(&self, e: redis::RedisError) -> RedisError {
        self.conn.failed(&e);
        RedisError::Script(e)
    }
}

impl RedisStore {
    /// How long a jobs call's record stays for its cancel (µs), from this
    /// store's timeout ([`call_life_us`]).
    fn call_life_us(&self) -> u64 {
        call_life_us(self.conn.timeout())
    }
}

/// Whether a failed call may have run on the server, so that its charges
/// are unknown to the caller: it timed out or its connection broke after
/// it was sent. Not a refused connection (nothing was sent), not a
/// script's error reply (the script charged nothing: `EXPIRED`, a bad
/// request).
fn reply_may_be_lost(e: &RedisError) -> bool {
    match e {
        RedisError::Script(e) => {
            !e.is_connection_refusal()
                && (e.is_timeout() || e.is_io_error() || e.is_connection_dropped())
        }
        _ => false,
    }
}

/// The `kind` label of a failed Redis call.
fn error_kind(e: &redis::RedisError) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        "connection"
    } else {
        "server"
    }
}

impl Store for RedisStore {
    fn may_have_run(e: &RedisError) -> bool {
        reply_may_be_lost(e)
    }

    async fn prepare_shapes(&self, shapes: &[Shape]) -> Result<(), RedisError> {
        for shape in shapes {
            self.scripts
                .prepare_shape(&self.conn, shape)
                .await
                .map_err(RedisError::Load)?;
        }
        Ok(())
    }

    fn unix_us_at(&self, now: tokio::time::Instant) -> Option<u64> {
        self.clock.at(now)
    }

    type Error = RedisError;

    async fn refund(&self, call: &RefundCall) -> Result<u64, RedisError> {
        let keys: Vec<&str> = call.keys().collect();
        self.scripts
            .call(&self.conn, Entry::Limiter, &keys, &call.args())
            .await
            .map_err(|e| self.failed(e))
    }

    async fn run_jobs(&self, call: &JobsCall) -> Result<Vec<JobsReply>, RedisError> {
        // Only on Redis' clock: an explicit time (tests) says nothing of it.
        let on_redis_clock = call.now_us.is_none();
        let (deadline, life) = if on_redis_clock {
            (
                self.clock.deadline(local_us(), self.conn.timeout()),
                Some(self.call_life_us()),
            )
        } else {
            (None, None)
        };
        // The limiter cancels a call whose reply may be lost
        // (`Store::may_have_run`).
        let args = call.wire_args(deadline, life);
        let answer = match Shape::of_call(call) {
            Some(shape) => match self.invoke_shape(&shape, call, &args).await {
                Some(raw) => {
                    JobsAnswer::from_compact(&raw?, call.requests.len(), call.guard.is_some())?
                }
                None => JobsAnswer::from_slice(
                    &self.invoke(call.keys(), args).await?,
                    call.guard.is_some(),
                )?,
            },
            None => JobsAnswer::from_slice(
                &self.invoke(call.keys(), args).await?,
                call.guard.is_some(),
            )?,
        };
        match (answer.epoch, &call.guard) {
            (EpochFound::Lost, Some(guard)) => LimiterStateLost {
                epoch: &guard.epoch,
                on_loss: guard.on_loss.wire(),
                max_wait: guard.max_wait_us.map(Duration::from_micros),
            }
            .emit(),
            (EpochFound::NewInstall, Some(guard)) => LimiterStateStarted {
                epoch: &guard.epoch,
            }
            .emit(),
            (EpochFound::RolledBack, Some(guard)) => LimiterStateRolledBack {
                max_wait: guard.max_wait_us.map(Duration::from_micros),
            }
            .emit(),
            _ => {}
        }
        if let (true, Some(first)) = (on_redis_clock, answer.replies.first()) {
            self.clock.observe(first.head.now_us, local_us());
        }
        Ok(answer.replies)
    }

    async fn read_epoch(&self, key: &str) -> Result<Option<u64>, RedisError> {
        let mut conn = self.conn.get();
        let v: Option<String> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        // The script writes it as an integer; anything else is no epoch.
        Ok(v.and_then(|v| v.parse().ok()))
    }

    async fn read_rollbacks(
        &self,
        key: &str,
        after_us: u64,
    ) -> Result<Vec<RollbackFound>, RedisError> {
        let mut conn = self.conn.get();
        let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg(format!("({after_us}"))
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        // The script writes every member; anything else is not a find.
        Ok(members
            .iter()
            .filter_map(|m| RollbackFound::parse(m))
            .collect())
    }

    async fn restore(&self, call: &RestoreCall) -> Result<Vec<i64>, RedisError> {
        self.invoke(call.keys(), call.args()).await
    }

    async fn begin_install(&self, epoch: &str, server: Option<&str>) -> Result<bool, RedisError> {
        let keys: Vec<&str> = std::iter::once(epoch).chain(server).collect();
        let wrote: u64 = self
            .scripts
            .call(&self.conn, Entry::Limiter, &keys, &install_args())
            .await
            .map_err(|e| self.failed(e))?;
        Ok(wrote == 1)
    }

    async fn release(&self, key: &str, leases: &[String]) -> Result<u64, RedisError> {
        self.scripts
            .call(&self.conn, Entry::Limiter, &[key], &release_args(leases))
            .await
            .map_err(|e| self.failed(e))
    }

    async fn cancel_jobs(&self, call: &JobsCall) -> Result<Vec<i64>, RedisError> {
        self.invoke(call.keys(), call.cancel_wire_args(self.call_life_us()))
            .await
    }

    async fn block(
        &self,
        at: &BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> Result<u64, RedisError> {
        let keys = [at.key.as_str()];
        let args = at.block_args(now_us, dur_us);
        self.scripts
            .call(&self.conn, Entry::Block, &keys, &args)
            .await
            .map_err(|e| self.failed(e))
    }

    async fn block_learning(&self, at: &BlockAt, call: &BlockCall) -> Result<Blocked, RedisError> {
        let keys = [at.key.as_str()];
        let reply: redis::Value = self
            .scripts
            .call(&self.conn, Entry::Block, &keys, &call.args(at))
            .await
            .map_err(|e| self.failed(e))?;
        let ints: Vec<i64> = match reply {
            redis::Value::Int(i) => vec![i],
            redis::Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    redis::Value::Int(i) => *i,
                    _ => -1,
                })
                .collect(),
            _ => Vec::new(),
        };
        call.read(&ints)
            .ok_or(RedisError::Malformed(MalformedReply(ints)))
    }
}
