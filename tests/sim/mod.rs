//! A deterministic simulation of the worker's engine: the real engine code
//! (`throttle_worker::worker::Engine`) against in-memory ports on tokio's
//! paused clock, with one seed choosing the whole world: partitions,
//! sellers and rules, jobs, and the faults (downstream outages and 429s,
//! Redis errors, hangs and data losses, rebalances, crashes, clock jumps,
//! failed writes, malformed records). One seed replays one run exactly.
//! Invariants are judged where a user would see them where they can be:
//! calls as the downstream received them, grants as the store made them.
//!
//! - [`scenario`]: the world a seed draws, and hand-made ones for defects.
//! - [`broker`]: topic logs, commits with their metadata, the handoff
//!   ledger, and the consumer ([`broker::SimSource`]): the worker's own
//!   consumer logic (`kafka::session`) over a deterministic broker.
//! - [`ports`]: the downstream, the record writer and Redis: the
//!   production Lua (`lua/`, the Functions library the product loads) on
//!   an embedded Redis (`tests/lua_redis/`) on the store's clock, its
//!   calls built and its replies read by the product's own code.
//! - [`journal`]: what the world saw.
//! - [`check`]: the invariants, judged after every run.
//! - `batching`: limiter calls per admitted job in fixed worlds, the
//!   guard that catches asks no longer coalesced.
//! - `fair`: weighted fair shares of the downstream slots, measured in
//!   hand-made worlds where the downstream is the bottleneck.
//! - [`run`]: one run of a scenario.
//! - [`fleet`]: several replicas in one group through kills, graceful
//!   joins, leaves and restarts, with skewed wall clocks, under a
//!   membership protocol.

mod adaptive;
mod batching;
pub mod broker;
pub mod check;
pub mod clock;
mod engine;
mod fair;
pub mod fleet;
pub mod journal;
mod learn;
pub mod ports;
mod priority;
mod restore;
pub mod run;
pub mod scenario;
