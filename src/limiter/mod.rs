//! The shared per-seller limiter, in four layers. Each file imports only
//! from its own layer or the ones above it in this list, never below
//! (`tests/code/inner_graph.rs` fails on any cycle between files, and on
//! any import against this order: `LIMITER_LAYERS`):
//!
//! 1. **Rules and policy** (pure):
//!    - [`rule`]: a validated rule (algorithm, limit per period, burst);
//!    - [`decision`]: the typed answers: granted, denied with a
//!      retry-after, never;
//!    - [`learn`]: sellers' limits learnt from the downstream's 429s
//!      (`limits.learn`): the terms, and the factor's reading; the scripts
//!      scale the rules (`lua/learn.lua`);
//!    - [`policy`]: which rules apply to a seller (default, tiers,
//!      overrides, unlimited, global), built once from config;
//!    - [`overrides`], [`pauses`], [`waits`]: the operators' overrides and
//!      pauses and the replicas' wait board, as values (what is in force
//!      when).
//! 2. **Call arguments and replies** (pure):
//!    - [`parts`]: this replica's recent grants per seller and rule (keyed
//!      by [`KeyedRule`](script::KeyedRule)), within a byte budget, for
//!      restores after a loss of Redis' data;
//!    - [`keys`]: Redis key names, one hash tag per seller: one hash holds
//!      a seller's block and every rule's state;
//!    - [`script`]: one call of the Lua as data ([`JobsCall`],
//!      [`RefundCall`], [`BlockCall`]);
//!    - [`reply`]: the script's raw reply and its reading as a
//!      [`BatchDecision`];
//!    - [`shape`]: straight-line Lua per call shape: the common jobs call
//!      (one algorithm per place, no slots or global rules) runs a
//!      generated function with a compact reply; every other call the
//!      general library.
//! 3. **The store** (I/O):
//!    - [`store`]: the [`Store`] trait: where the state lives, as the
//!      calls it runs;
//!    - [`redis`]: the only module that talks to Redis; runs `lua/` as a
//!      Redis Functions library (FCALL), or with EVALSHA where Functions
//!      are missing, on one server or a Redis Cluster.
//! 4. **The [`Limiter`] facade**, one type whose `impl` blocks sit with
//!    the concern they serve (table below): [`core`],
//!    [`jobs`], [`coalesce`] ([`Coalescer`], many sellers' job lists in
//!    one call), `shadow`, [`inspect`], `refresh`.
//!
//! Beside them, the reference model: [`local`], the scripts' algorithms
//! in pure Rust (the model's production half) and a replica's share of
//! every limit in memory, for `redis.on_error = "local"` while Redis does
//! not answer; and `testkit`, the model's test half (the job-list driver,
//! the block, slots and call records, a manual clock), compiled only for
//! tests (`cfg(test)` or the `testkit` feature, which the crate's
//! dev-dependency on itself turns on); never in the product. `testkit`
//! imports `local`, never the reverse.
//!
//! # [`Limiter`], file by file
//!
//! One type; its `impl` blocks sit with the concern they serve:
//!
//! | file | what of [`Limiter`] it holds |
//! |------|------------------------------|
//! | `core.rs` | the struct, `new`, the policy, overrides and pauses in force (`set_*`), [`Request`] and [`JobsQuery`], the single decision (`acquire`, `check`: a jobs call of one job), refunds, downstream blocks (`block`, `block_at`) |
//! | `jobs.rs` | job lists (asked as [`JobsQuery`]): `acquire_jobs`, `check_jobs`, `check_jobs_many`; slot leases given back (`release`) |
//! | `shadow.rs` | shadow rules asked after a grant |
//! | `inspect.rs` | `inspect`: a seller's live state, charging nothing |
//! | `restore.rs` | after a loss of Redis' data: this replica's grants recorded (`record_grants`), the epoch watched and its part written back (`watch_epoch`, `restore_after`) |
//! | `refresh.rs` | on a [`RedisStore`]: `refresh_overrides`, `refresh_pauses`, the wait board (`publish_waits`, `read_waits`), a seller's learnt factor (`learning`) |
//!
//! # One road to Redis
//!
//! Every decision is a jobs call, [`JobsQuery`] → [`JobsCall`] →
//! [`JobsReply`] → [`BatchDecision`] (`lua/jobs.lua`):
//!
//! - the worker: its engine asks `acquire_jobs` of the [`Coalescer`], which
//!   sends many sellers' lists as one `check_jobs_many` call;
//! - a single decision ([`Limiter::acquire`], [`Limiter::check`]): one job
//!   of the whole cost, or up to the cost as jobs of one unit; the
//!   operator's `limits peek` is its dry run, and `limiter demo` and the
//!   benches use it;
//! - shadow rules after a grant and `limits show` (`inspect.rs`): a request
//!   over those rules alone (`Limiter::request_alone`, `Limiter::dry_run`).
//!
//! Beside it run the block (`lua/block.lua`), the release of slots, the
//! cancel of a call whose reply was lost (`lua/calls.lua`) and the refund
//! ([`RefundCall`]): of what the global rules cut, in Redis Cluster, and
//! of granted jobs no call used (a revoke or a shutdown stranded them,
//! [`Limiter::give_back`]).

pub mod coalesce;
pub mod core;
pub mod decision;
pub mod inspect;
pub mod jobs;
pub mod keys;
pub mod learn;
pub mod local;
pub mod overrides;
pub mod parts;
pub mod pauses;
pub mod policy;
pub mod redis;
mod refresh;
pub mod reply;
mod restore;
pub mod rule;
pub mod script;
mod shadow;
pub mod shape;
pub mod store;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod waits;

pub use self::core::{InstallCheck, JobsQuery, Limiter, LimiterError, Request};
pub use coalesce::{CoalesceError, CoalesceSettings, Coalescer};
pub use decision::{
    BatchDecision, BatchGranted, CannotPass, Decision, Denied, DeniedBy, Granted, Mode, NextJob,
    Pace, Receipt, Unused,
};
pub use jobs::ListAnswer;
pub use keys::KeySpace;
pub use learn::{Blocked, LearnTerms, Learnt};
pub use pauses::{Pause, Pauses};
pub use policy::{Policy, Resolved, Share, SLOT_POLL};
pub use redis::{RedisError, RedisStore, Scripts};
pub use reply::{EpochFound, JobsAnswer, JobsReply, MalformedReply, Reply, RollbackFound};
pub use restore::RestoreReport;
pub use rule::{Algorithm, Rule, RuleError};
pub use script::{
    call_life_us, install_args, release_args, BlockAt, BlockCall, BlockRead, FunctionLibrary,
    JobsCall, JobsRequest, KeyedRule, Loss, LossGuard, RefundCall, RestoreCall, Seen, SlotTerms,
    StateKey,
};
pub use store::Store;
