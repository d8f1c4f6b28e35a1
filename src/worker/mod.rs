//! The worker: Kafka consumer group → per-seller permit → downstream API.
//!
//! The engine and its components, each owning its state. The components do
//! no I/O, read no clock and emit no event: each takes `now` and plain data
//! and says what should happen and what happened; the engine carries it
//! out and reports it. Imports form a tree: the engine imports the
//! components, the components import [`pending`], `pool`, `seller` and
//! `timers`, none imports the engine.
//! - [`engine`]: the event loop; it alone touches the ports, spawns tasks
//!   and holds channels. Its files follow a job's path (records, ask,
//!   call, write, pause, partitions, drain).
//! - `scheduler`: every seller with work here, their phases and holds;
//!   `seller`: one seller's queues, the heads it asks about and what the
//!   wait report reads of it; `turns`: the downstream slot pool and whose
//!   turn is next at it; `pool`: the downstream slots, given back when
//!   dropped; `fair`: the turns' weighted fair shares (`limits.weight` and
//!   `limits.min_share`).
//! - [`concurrency`]: how many downstream calls may be out at once,
//!   learnt from the downstream's answers (`downstream.adaptive_concurrency`).
//! - `admission`: the limiter's health and the failure policy
//!   (`redis.on_error`).
//! - `tiers`: which retry tier a job goes to, and the records parked on
//!   them.
//! - `answers`: what a downstream answer does to its job (done, retry at,
//!   held for the outage, dead-lettered) and a run's 429s to its seller.
//! - `outage`: a downstream outage told apart from a job's own failure.
//! - `arrival`: where a record taken up goes (parked on its tier, queued,
//!   delayed in memory, deferred); `oversize`: a copy the broker refused
//!   as too large; `paused`: an operator pause's intervals.
//! - `partitions`: the jobs topic's partitions held here (the local share);
//!   `handoff`: the work under way per partition, which a revoke waits
//!   for, and what an answer does during that wait.
//! - [`memory`]: jobs and bytes held, and when fetching pauses.
//! - `timers`: the timer heap and saturating time arithmetic.
//! - [`waits`]: each seller's wait as an operator reads it (oldest job,
//!   predicted drain, what holds it).
//! - [`pending`]: a job in memory, as the components pass it around;
//!   [`ordering`]: the lane it runs in (`worker.ordering`): one job of a
//!   lane is out at a time, in offset order.
//!
//! Around the engine:
//! - [`ports`]: the traits through which the engine reaches its world
//!   (clock, consumer, writer, downstream; the limiter is [`Permits`]),
//!   and the production implementations ([`ports::Live`]).
//! - [`slots`]: slots of a seller's `max_in_flight` across the fleet, held
//!   by granted jobs as leases that go back when dropped.
//! - [`charges`]: the units a grant charged, held by its jobs until their
//!   calls start; a job dropped uncalled (a revoke, a shutdown) gives its
//!   units back.
//! - [`permit`]: the limiter as the worker sees it, and the one place where
//!   a limiter failure becomes a decision.
//! - [`reload`]: the config file watched, its `[limits]` applied live;
//!   `refresh`: overrides and pauses read from Redis on a timer.
//! - [`ledger`]: the consumers' handoff ledger in Redis (what each commit
//!   says is finished, where a rebalance cannot refuse it).
//! - `start`: [`run`] checks every dependency at startup, then runs the
//!   engine until the shutdown future resolves, and closes the clients.

mod admission;
mod answers;
mod arrival;
pub mod charges;
pub mod concurrency;
pub mod engine;
mod fair;
#[cfg(test)]
mod fixtures;
mod handoff;
pub mod ledger;
pub mod memory;
pub mod ordering;
mod outage;
mod oversize;
mod partitions;
mod paused;
pub mod pending;
pub mod permit;
mod pool;
pub mod ports;
mod refresh;
pub mod reload;
mod scheduler;
mod seller;
pub mod slots;
mod start;
mod tiers;
mod timers;
mod turns;
pub mod waits;

pub use engine::{Deps, Engine, Summary};
pub use pending::Pending;
pub use permit::{OnLimiterError, PermitError, Permits, SellerInfo};
pub use ports::{Caller, Clock, CommitError, Live, Ports, Source, SystemClock, WriteError, Writer};
pub use start::{run, run_watching, StartError};
