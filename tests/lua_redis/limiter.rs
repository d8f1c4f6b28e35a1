//! The limiter's calls on the embedded Redis, as the product makes them
//! on a real one (`RedisStore` in src/limiter/redis/store.rs): the same
//! KEYS, the same ARGV (`JobsCall::wire_args`, `BlockAt::block_args`, ...)
//! and the same reading of the raw reply (`JobsAnswer::from_slice`). Only the transport differs.

use throttle_worker::limiter::{
    install_args, release_args, BlockAt, BlockCall, Blocked, JobsAnswer, JobsCall, RefundCall,
    RestoreCall, RollbackFound,
};

use super::{EmbeddedError, EmbeddedRedis, Reply, Script};

impl EmbeddedRedis {
    /// A refund of an earlier jobs request (`RedisStore::refund`): the
    /// units asked back.
    pub fn refund(&self, call: &RefundCall, at_us: u64) -> Result<u64, EmbeddedError> {
        let keys: Vec<&str> = call.keys().collect();
        count(self.invoke(Script::Limiter, &keys, &call.args(), at_us)?)
    }

    /// One jobs call (`RedisStore::run_jobs`), with the life of its
    /// record (`None`: the script's default, as with an explicit time).
    /// No deadline: a call here runs the instant it is sent, never after
    /// its caller gave up.
    pub fn run_jobs(
        &self,
        call: &JobsCall,
        life_us: Option<u64>,
        at_us: u64,
    ) -> Result<JobsAnswer, EmbeddedError> {
        let keys: Vec<&str> = call.keys().collect();
        let args = call.wire_args(None, life_us);
        let raw = integers(self.invoke(Script::Limiter, &keys, &args, at_us)?)?;
        Ok(JobsAnswer::from_slice(&raw, call.guard.is_some())?)
    }

    /// The cancel of a jobs call (`RedisStore::cancel_jobs`).
    pub fn cancel_jobs(
        &self,
        call: &JobsCall,
        life_us: u64,
        at_us: u64,
    ) -> Result<Vec<i64>, EmbeddedError> {
        let keys: Vec<&str> = call.keys().collect();
        let args = call.cancel_wire_args(life_us);
        integers(self.invoke(Script::Limiter, &keys, &args, at_us)?)
    }

    /// A replica's part written back after a loss (`RedisStore::restore`):
    /// per rule, the units charged, -1 or -2 (`lua/restore.lua`).
    pub fn restore(&self, call: &RestoreCall, at_us: u64) -> Result<Vec<i64>, EmbeddedError> {
        let keys: Vec<&str> = call.keys().collect();
        integers(self.invoke(Script::Limiter, &keys, &call.args(), at_us)?)
    }

    /// The epoch at `key` (`RedisStore::read_epoch`): `GET`, an integer
    /// or nothing.
    pub fn read_epoch(&self, key: &str, at_us: u64) -> Option<u64> {
        match self.command(&["GET", key], at_us) {
            Ok(Reply::Bulk(b)) => std::str::from_utf8(&b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The finds listed at `key` after `after_us`
    /// (`RedisStore::read_rollbacks`: `ZRANGEBYSCORE key (after +inf`).
    pub fn read_rollbacks(&self, key: &str, after_us: u64, at_us: u64) -> Vec<RollbackFound> {
        let after = format!("({after_us}");
        match self.command(&["ZRANGEBYSCORE", key, &after, "+inf"], at_us) {
            Ok(Reply::Array(items)) => items
                .iter()
                .filter_map(|m| match m {
                    Reply::Bulk(b) => RollbackFound::parse(std::str::from_utf8(b).ok()?),
                    _ => None,
                })
                .collect(),
            other => panic!("ZRANGEBYSCORE {key}: {other:?}"),
        }
    }

    /// Slots given back (`RedisStore::release`): how many were held.
    pub fn release(&self, key: &str, leases: &[String], at_us: u64) -> Result<u64, EmbeddedError> {
        count(self.invoke(Script::Limiter, &[key], &release_args(leases), at_us)?)
    }

    /// A new install's epoch (`RedisStore::begin_install`): whether it
    /// was written.
    pub fn begin_install(
        &self,
        epoch: &str,
        server: Option<&str>,
        at_us: u64,
    ) -> Result<bool, EmbeddedError> {
        let keys: Vec<&str> = std::iter::once(epoch).chain(server).collect();
        Ok(count(self.invoke(Script::Limiter, &keys, &install_args(), at_us)?)? == 1)
    }

    /// A seller's downstream block (`RedisStore::block`): when it ends.
    pub fn block(
        &self,
        at: &BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
        at_us: u64,
    ) -> Result<u64, EmbeddedError> {
        let keys = [at.key.as_str()];
        count(self.invoke(Script::Block, &keys, &at.block_args(now_us, dur_us), at_us)?)
    }

    /// A block with its learn drop (`RedisStore::block_learning`).
    pub fn block_learning(
        &self,
        at: &BlockAt,
        call: &BlockCall,
        at_us: u64,
    ) -> Result<Blocked, EmbeddedError> {
        let keys = [at.key.as_str()];
        let reply = self.invoke(Script::Block, &keys, &call.args(at), at_us)?;
        let ints = match &reply {
            Reply::Int(i) => vec![*i],
            _ => integers(reply.clone())?,
        };
        call.read(&ints).ok_or(EmbeddedError::Shape(reply))
    }
}

/// A flat array of integers, as redis-rs reads one into `Vec<i64>`
/// (integers, or strings that hold one).
fn integers(reply: Reply) -> Result<Vec<i64>, EmbeddedError> {
    let Reply::Array(items) = reply else {
        return Err(EmbeddedError::Shape(reply));
    };
    items
        .iter()
        .map(|item| match item {
            Reply::Int(i) => Ok(*i),
            Reply::Bulk(b) => {
                super::commands::integer(b).map_err(|_| EmbeddedError::Shape(item.clone()))
            }
            _ => Err(EmbeddedError::Shape(item.clone())),
        })
        .collect()
}

/// One integer at or above zero, as redis-rs reads a `u64`.
fn count(reply: Reply) -> Result<u64, EmbeddedError> {
    match reply {
        Reply::Int(i) if i >= 0 => Ok(i as u64),
        other => Err(EmbeddedError::Shape(other)),
    }
}
