//! Test target `sim`: the engine under a deterministic simulation
//! (`sim::engine::`); no network, tokio's paused clock. See `sim/mod.rs`.

#[path = "sim/mod.rs"]
mod sim;
// The simulation's Redis: the production Lua, embedded. Shared with the
// `limiter` target, which holds it to a real Redis; each target uses only
// part of it.
#[allow(dead_code)]
#[path = "lua_redis/mod.rs"]
mod lua_redis;
