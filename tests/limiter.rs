//! Test target `limiter`: the limiter's scripts against a real Redis
//! (`limiter::`), and Redis as production runs it (`redis::`). Needs
//! `REDIS_URL` (scripts/with-redis.sh starts one); the ACL, TLS, cluster
//! and outage tests start private `redis-server`s of their own.

mod common;
#[path = "limiter/mod.rs"]
mod limiter;
mod redis;
// The simulation's embedded Redis (`sim` target), held to this real one
// (`limiter::embedded`); this target uses only part of it.
#[allow(dead_code)]
#[path = "lua_redis/mod.rs"]
mod lua_redis;
