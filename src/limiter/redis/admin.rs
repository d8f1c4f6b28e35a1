//! The reads and writes beside the limiter's Lua, one plain command each:
//! the overrides and pauses hashes, `limits reset`,
//! the slot leases `limits show` counts, Redis' clock (`TIME`) and a key's
//! memory. Operators' commands and the replicas' refreshes use them.
//!
//! An `impl RedisStore` because they are the store's public API; they
//! reach it only through a connection handle (and the clock, for `TIME`).

use std::collections::HashMap;
use std::time::Duration;

use super::clock::local_us;
use super::{RedisError, RedisStore};

impl RedisStore {
    /// Members of a sorted set scored above `min` (`ZCOUNT key (min
    /// +inf`): the leases of `max_in_flight` not lapsed at `min` µs.
    pub async fn count_above(&self, key: &str, min: u64) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("ZCOUNT")
            .arg(key)
            .arg(format!("({min}"))
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Redis' clock in Unix ms (`TIME`): every replica and operator
    /// command reads the same one, whatever their own clocks say.
    pub async fn time_ms(&self) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)?;
        let redis_us = s * 1_000_000 + us;
        self.clock
            .observe(i64::try_from(redis_us).unwrap_or(i64::MAX), local_us());
        Ok(redis_us / 1000)
    }

    /// Every field of a hash (`HGETALL`): the overrides, the pauses.
    pub async fn read_hash(&self, key: &str) -> Result<HashMap<String, String>, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Sets one field of a hash that is kept until deleted (`HSET`): an
    /// override, a pause.
    pub async fn set_field(&self, key: &str, field: &str, value: &str) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("HSET")
            .arg(key)
            .arg(field)
            .arg(value)
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(RedisError::Script)
    }

    /// Removes fields of a hash (`HDEL`); returns how many there were.
    pub async fn delete_fields(&self, key: &str, fields: &[String]) -> Result<u64, RedisError> {
        if fields.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.get();
        redis::cmd("HDEL")
            .arg(key)
            .arg(fields)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// One field of a hash (`HGET`); `None` when absent.
    pub async fn hash_field(&self, key: &str, field: &str) -> Result<Option<String>, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Several fields of a hash in one call (`HMGET`), in the order asked;
    /// `None` for each absent one.
    pub async fn hash_fields(
        &self,
        key: &str,
        fields: &[String],
    ) -> Result<Vec<Option<String>>, RedisError> {
        if fields.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.get();
        redis::cmd("HMGET")
            .arg(key)
            .arg(fields)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Sets one field of a hash and keeps the hash `ttl` from now (`HSET`
    /// then `PEXPIRE`, atomically).
    pub async fn set_hash_field(
        &self,
        key: &str,
        field: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), RedisError> {
        let fields = [(field.to_owned(), value.to_owned())];
        self.hset_expire(key, &fields, ttl, true).await
    }

    /// Sets fields of a hash, then keeps the hash `ttl` from now (`HSET`
    /// and `PEXPIRE` in one round trip, not a transaction: the worker's
    /// ACL has no `MULTI`, and a hash left without its new expiry keeps
    /// the old one).
    pub async fn set_hash_fields(
        &self,
        key: &str,
        fields: &[(String, String)],
        ttl: Duration,
    ) -> Result<(), RedisError> {
        if fields.is_empty() {
            return Ok(());
        }
        self.hset_expire(key, fields, ttl, false).await
    }

    async fn hset_expire(
        &self,
        key: &str,
        fields: &[(String, String)],
        ttl: Duration,
        atomic: bool,
    ) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
        let mut hset = redis::cmd("HSET");
        hset.arg(key);
        for (field, value) in fields {
            hset.arg(field).arg(value);
        }
        let mut pipe = redis::pipe();
        if atomic {
            pipe.atomic();
        }
        pipe.add_command(hset)
            .ignore()
            .cmd("PEXPIRE")
            .arg(key)
            .arg(ttl.as_millis() as u64)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// `DEL keys…` (one slot: a seller's keys share a hash tag); returns how
    /// many existed. For `limits reset`.
    pub async fn delete(&self, keys: &[String]) -> Result<u64, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }

    /// Which of `keys` exist (`EXISTS`, one a key; a seller's keys are few),
    /// for `limits reset --dry-run`, which deletes nothing.
    pub async fn existing(&self, keys: &[String]) -> Result<Vec<String>, RedisError> {
        let mut conn = self.conn.get();
        let mut out = Vec::new();
        for key in keys {
            let n: u64 = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut conn)
                .await
                .map_err(RedisError::Script)?;
            if n > 0 {
                out.push(key.clone());
            }
        }
        Ok(out)
    }

    /// `MEMORY USAGE key`: bytes a key takes, for the book's per-seller
    /// figures and the demo. `None` when the key does not exist.
    pub async fn memory_usage(&self, key: &str) -> Result<Option<u64>, RedisError> {
        let mut conn = self.conn.get();
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .map_err(RedisError::Script)
    }
}
