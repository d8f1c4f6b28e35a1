//! The shared per-seller limiter.
//!
//! - [`rule`]: a validated rule (algorithm, limit per period, burst).
//! - [`decision`]: the typed answers: granted, denied with a retry-after, never.
//! - [`policy`]: which rules apply to a seller (default, tiers, overrides,
//!   unlimited, global), built once from config.
//! - [`keys`]: Redis key names, one hash tag per seller.
//! - [`layout`]: which state layout a replica runs when `redis.state` is
//!   not set (the install's marker), v2 for a new install.
//! - [`script`]: one call of the Lua script as data, and the [`Store`] trait.
//! - [`reply`]: the script's raw reply and its reading as a [`Decision`].
//! - [`permits`]: [`Limiter`], which resolves rules, calls the store and
//!   answers with a [`Decision`].
//! - [`batch`]: [`Limiter::acquire_jobs`], a list of job costs granted as
//!   the longest prefix that fits, in one script call ([`BatchDecision`]);
//!   for a seller with `max_in_flight`, each granted job also takes a slot
//!   leased in Redis in the same call (`lua/slots.lua`, [`SlotTerms`]),
//!   given back with [`Limiter::release`].
//! - [`coalesce`]: [`Coalescer`], many sellers' job lists in one call.
//! - `shadow`: rules in shadow mode, asked after a grant and counted,
//!   never holding a job.
//! - [`pauses`]: operators' pauses of one seller or of every seller, kept
//!   in Redis and read by every replica.
//! - [`inspect`]: a seller's live state per rule, charging nothing
//!   (`limits show`).
//! - [`model`]: pure-Rust reference models of every script, with an injected clock.
//! - [`local`]: a replica's share of every limit in memory, for
//!   `redis.on_error = "local"` while Redis does not answer.
//! - [`redis`]: the only module that talks to Redis; runs `lua/` as a Redis
//!   Functions library (FCALL), or with EVALSHA where Functions are missing,
//!   on one server or a Redis Cluster.

pub mod coalesce;
pub mod core;
pub mod decision;
pub mod inspect;
pub mod jobs;
pub mod keys;
pub mod layout;
pub mod local;
pub mod model;
pub mod overrides;
pub mod pauses;
pub mod policy;
pub mod redis;
pub mod reply;
pub mod rule;
pub mod script;
mod shadow;

pub use self::core::{Limiter, LimiterError, Request};
pub use coalesce::{CoalesceError, CoalesceSettings, Coalescer};
pub use decision::{
    BatchDecision, BatchGranted, CannotPass, Decision, Denied, DeniedBy, Granted, Mode, NextJob,
    Pace,
};
pub use jobs::{JobsQuery, ListAnswer};
pub use keys::{KeySpace, StateLayout};
pub use pauses::{Pause, Pauses};
pub use policy::{Policy, Resolved, SLOT_POLL};
pub use redis::{RedisError, RedisStore, Scripts};
pub use reply::{JobsReply, Reply};
pub use rule::{Algorithm, Rule, RuleError};
pub use script::{
    BlockAt, BlockRead, FunctionLibrary, JobsCall, JobsRequest, KeyedRule, Op, ScriptCall,
    SlotTerms, StateKey, Store,
};
