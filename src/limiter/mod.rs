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
//! - [`shape`]: straight-line Lua per call shape: the common jobs call
//!   (state v2, one algorithm per place, no slots or global rules) runs a
//!   generated function with a compact reply; every other call the
//!   general library.
//! - [`core`](self::core): [`Limiter`], which resolves rules, calls the store
//!   and answers with a [`Decision`].
//! - [`jobs`]: [`Limiter::acquire_jobs`], a list of job costs granted as
//!   the longest prefix that fits, in one script call ([`BatchDecision`]);
//!   for a seller with `max_in_flight`, each granted job also takes a slot
//!   leased in Redis in the same call (`lua/slots.lua`, [`SlotTerms`]),
//!   given back with [`Limiter::release`].
//! - [`coalesce`]: [`Coalescer`], many sellers' job lists in one call.
//! - `shadow`: rules in shadow mode, asked after a grant and counted,
//!   never holding a job.
//! - [`pauses`]: operators' pauses of one seller or of every seller, kept
//!   in Redis and read by every replica.
//! - [`learn`]: sellers' limits learnt from the downstream's 429s
//!   (`limits.learn`): the terms, and the factor's reading; the scripts
//!   scale the rules (`lua/learn.lua`).
//! - [`inspect`]: a seller's live state per rule, charging nothing
//!   (`limits show`).
//! - [`local`]: the scripts' algorithms in pure Rust (the reference model's
//!   production half) and a replica's share of every limit in memory, for
//!   `redis.on_error = "local"` while Redis does not answer.
//! - `testkit`: the reference model's test half (the job-list driver, the
//!   block, slots and call records, a manual clock), compiled only for
//!   tests (`cfg(test)` or the `testkit` feature, which the crate's
//!   dev-dependency on itself turns on); never in the product.
//! - [`redis`]: the only module that talks to Redis; runs `lua/` as a Redis
//!   Functions library (FCALL), or with EVALSHA where Functions are missing,
//!   on one server or a Redis Cluster.
//!
//! # [`Limiter`], file by file
//!
//! One type; its `impl` blocks sit with the concern they serve:
//!
//! | file | what of [`Limiter`] it holds |
//! |------|------------------------------|
//! | `core.rs` | the struct, `new`, the policy, overrides and pauses in force (`set_*`), [`Request`] and the single decision (`acquire`, `check`, refunds), downstream blocks (`block`, `block_at`) |
//! | `jobs.rs` | job lists: [`JobsQuery`], `acquire_jobs`, `check_jobs`, `check_jobs_many`; slot leases given back (`release`) |
//! | `shadow.rs` | shadow rules asked after a grant |
//! | `inspect.rs` | `inspect`: a seller's live state, charging nothing |
//! | `overrides.rs` | `refresh_overrides` (on a [`RedisStore`]) |
//! | `pauses.rs` | `refresh_pauses` (on a [`RedisStore`]) |
//!
//! # Two request pipelines, and who uses which
//!
//! - **One decision**, [`Request`] → [`ScriptCall`] → [`Reply`] →
//!   [`Decision`] (`lua/limiter.lua`), through [`Limiter::acquire`] and
//!   [`Limiter::check`]: the operator's `limits peek` (a dry run,
//!   `operator/seller.rs`), `limiter demo` (`demo/limiter.rs`), `benches/limiter.rs`
//!   and `benches/memory.rs`, and the tests that pin one decision (e.g.
//!   `limiter::tables`, `redis::acl`, `redis::faults`, `limiter::shadow`). The
//!   worker's [`Permits`](crate::worker::Permits) trait has an `acquire`
//!   for it too, but the engine does not call it: it asks by job lists.
//!   `shadow.rs` and `inspect.rs` build [`ScriptCall`]s of their own (shadow
//!   rules after a grant; `limits show`).
//! - **A list of jobs**, [`JobsQuery`] → [`JobsCall`] → [`JobsReply`] →
//!   [`BatchDecision`] (`lua/jobs.lua`), through [`Limiter::acquire_jobs`],
//!   [`Limiter::check_jobs`] and [`Limiter::check_jobs_many`]: the worker.
//!   Its engine asks `acquire_jobs` of the [`Coalescer`], which sends many
//!   sellers' lists as one `check_jobs_many` call; also `benches/redis_cost.rs`
//!   (direct and coalesced) and the `limiter::jobs`, `limiter::in_flight`,
//!   `limiter::rolling` and `limiter::coalesce` tests.

pub mod coalesce;
pub mod core;
pub mod decision;
pub mod inspect;
pub mod jobs;
pub mod keys;
pub mod layout;
pub mod learn;
pub mod local;
pub mod overrides;
pub mod pauses;
pub mod policy;
pub mod redis;
pub mod reply;
pub mod rule;
pub mod script;
mod shadow;
pub mod shape;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod waits;

pub use self::core::{Limiter, LimiterError, Request};
pub use coalesce::{CoalesceError, CoalesceSettings, Coalescer};
pub use decision::{
    BatchDecision, BatchGranted, CannotPass, Decision, Denied, DeniedBy, Granted, Mode, NextJob,
    Pace,
};
pub use jobs::{JobsQuery, ListAnswer};
pub use keys::{KeySpace, StateLayout};
pub use learn::{Blocked, LearnTerms, Learnt};
pub use pauses::{Pause, Pauses};
pub use policy::{Policy, Resolved, Share, SLOT_POLL};
pub use redis::{RedisError, RedisStore, Scripts};
pub use reply::{JobsAnswer, JobsReply, MalformedReply, Reply};
pub use rule::{Algorithm, Rule, RuleError};
pub use script::{
    call_life_us, release_args, BlockAt, BlockCall, BlockRead, FunctionLibrary, JobsCall,
    JobsRequest, KeyedRule, LossGuard, Op, ScriptCall, SlotTerms, StateKey, Store,
};
