//! One call of the limiter script, as data.
//!
//! The call is built here, in plain Rust, and run by a [`Store`]: Redis in
//! production, the reference model in tests. Nothing in this file knows how
//! Redis is reached.

use std::future::Future;

use super::decision::Mode;
use super::reply::{JobsReply, Reply};
use super::rule::Rule;

/// The limiter's Lua, as one library: helpers, one file per algorithm, the
/// job-list driver, the single-call driver, then the block. It only defines
/// functions (`limiter_call`, `block_call`); the tails below run them.
macro_rules! library_body {
    () => {
        concat!(
            include_str!("../../lua/common.lua"),
            include_str!("../../lua/fixed_window.lua"),
            include_str!("../../lua/sliding_window_log.lua"),
            include_str!("../../lua/sliding_window_counter.lua"),
            include_str!("../../lua/token_bucket.lua"),
            include_str!("../../lua/leaky_bucket.lua"),
            include_str!("../../lua/burst_fill.lua"),
            include_str!("../../lua/gcra.lua"),
            include_str!("../../lua/jobs.lua"),
            include_str!("../../lua/limiter.lua"),
            include_str!("../../lua/block.lua"),
        )
    };
}

/// The library's definitions, shared by the EVAL scripts and the Redis
/// Functions library.
pub const LIBRARY_BODY: &str = library_body!();

/// The limiter as an EVAL script (servers without Redis Functions, or an
/// ACL user without `FUNCTION LOAD`). Every call runs the definitions again
/// (about 60 closures), which is why Functions are preferred.
pub const LIMITER_LUA: &str = concat!(library_body!(), "\nreturn limiter_call(KEYS, ARGV)\n");

/// Sets a seller's downstream block, as an EVAL script (with the helpers
/// it shares with the limiter).
pub const BLOCK_LUA: &str = concat!(
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/block.lua"),
    "\nreturn block_call(KEYS, ARGV)\n"
);

/// The limiter as a Redis Functions library: loaded once per server
/// (`FUNCTION LOAD`), its definitions run once, and each call is an `FCALL`
/// of an already-built function.
///
/// The library and function names carry a hash of the code, so replicas of
/// two versions of the worker (a rolling deploy) each call their own code
/// on the same Redis, and loading one never replaces the other's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionLibrary {
    /// The library's name, `throttle_<hash>`.
    pub name: String,
    /// The whole `FUNCTION LOAD` payload, shebang included.
    pub code: String,
    /// FCALL name of the limiter (same KEYS and ARGV as [`LIMITER_LUA`]).
    pub limiter: String,
    /// FCALL name of the block (same KEYS and ARGV as [`BLOCK_LUA`]).
    pub block: String,
}

impl FunctionLibrary {
    pub fn new() -> FunctionLibrary {
        let version = format!("{:016x}", fnv1a(LIBRARY_BODY.as_bytes()));
        let name = format!("throttle_{version}");
        let limiter = format!("throttle_limiter_{version}");
        let block = format!("throttle_block_{version}");
        let code = format!(
            "#!lua name={name}\n{LIBRARY_BODY}\n\
             redis.register_function('{limiter}', limiter_call)\n\
             redis.register_function('{block}', block_call)\n"
        );
        FunctionLibrary {
            name,
            code,
            limiter,
            block,
        }
    }
}

impl Default for FunctionLibrary {
    fn default() -> Self {
        FunctionLibrary::new()
    }
}

/// FNV-1a, 64 bits: names a version of the code, nothing more.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Decide and charge.
    Acquire,
    /// Decide, charge nothing (operators' dry run).
    Peek,
    /// Give back `cost` units of an earlier call, skipping its first `skip`.
    /// The call's `now_us` is the refund's own time (at or after every
    /// call since the take; `None` = Redis' clock); `taken_at_us` is the
    /// `now_us` the acquire replied with. Only what is provably unused comes
    /// back (see `lua/common.lua`).
    Refund { skip: u64, taken_at_us: u64 },
}

/// One invocation of [`LIMITER_LUA`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    pub op: Op,
    /// µs since the epoch; `None` reads Redis' clock (production).
    pub now_us: Option<u64>,
    pub cost: u64,
    pub mode: Mode,
    /// Unique per call across all replicas; names sliding-log entries.
    pub call_id: String,
    pub block_key: String,
    /// Each rule with the key of its state.
    pub rules: Vec<(String, Rule)>,
}

impl ScriptCall {
    /// KEYS of the script: the block key, then one per rule.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.block_key.as_str()).chain(self.rules.iter().map(|(k, _)| k.as_str()))
    }

    /// ARGV of the script, as `lua/limiter.lua` documents it.
    pub fn args(&self) -> Vec<String> {
        let (op, mode) = match self.op {
            Op::Acquire => ("acquire", self.mode.wire().to_owned()),
            Op::Peek => ("peek", self.mode.wire().to_owned()),
            Op::Refund { skip, .. } => ("refund", skip.to_string()),
        };
        let mut args = vec![
            op.to_owned(),
            self.now_us.map(|n| n.to_string()).unwrap_or_default(),
            self.cost.to_string(),
            mode,
            self.call_id.clone(),
            self.rules.len().to_string(),
        ];
        for (_, r) in &self.rules {
            args.push(r.algorithm().name().to_owned());
            args.push(r.limit().to_string());
            args.push(r.period_us().to_string());
            args.push(r.burst().to_string());
        }
        if let Op::Refund { taken_at_us, .. } = self.op {
            args.push(taken_at_us.to_string());
        }
        args
    }
}

/// One seller's part of a jobs call: its keys and rules and the costs of
/// its jobs, in queue order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsRequest {
    /// Unique per call across all replicas; names sliding-log entries.
    pub call_id: String,
    pub block_key: String,
    /// Each rule with the key of its state.
    pub rules: Vec<(String, Rule)>,
    /// At least one, each >= 1.
    pub costs: Vec<u64>,
}

/// One invocation of [`LIMITER_LUA`] that grants, per request, the longest
/// prefix of its jobs that fits (`lua/jobs.lua`). A call is a list of
/// requests decided in order in one round trip: one seller's heads today,
/// several sellers' when calls are coalesced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsCall {
    /// µs since the epoch; `None` reads Redis' clock (production).
    pub now_us: Option<u64>,
    /// Decide without charging.
    pub dry_run: bool,
    pub requests: Vec<JobsRequest>,
}

impl JobsCall {
    /// KEYS: per request its block key, then one per rule.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.requests.iter().flat_map(|q| {
            std::iter::once(q.block_key.as_str()).chain(q.rules.iter().map(|(k, _)| k.as_str()))
        })
    }

    /// ARGV, as `lua/jobs.lua` documents it.
    pub fn args(&self) -> Vec<String> {
        let op = if self.dry_run { "jobs_peek" } else { "jobs" };
        let mut args = vec![
            op.to_owned(),
            self.now_us.map(|n| n.to_string()).unwrap_or_default(),
            self.requests.len().to_string(),
        ];
        for q in &self.requests {
            args.push(q.call_id.clone());
            let costs: Vec<String> = q.costs.iter().map(u64::to_string).collect();
            args.push(costs.join(","));
            args.push(q.rules.len().to_string());
            for (_, r) in &q.rules {
                args.push(r.algorithm().name().to_owned());
                args.push(r.limit().to_string());
                args.push(r.period_us().to_string());
                args.push(r.burst().to_string());
            }
        }
        args
    }
}

/// Where the limiter's state lives.
pub trait Store: Send + Sync {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs one limiter call.
    fn run(&self, call: &ScriptCall) -> impl Future<Output = Result<Reply, Self::Error>> + Send;

    /// Runs one jobs call: one reply per request, in order.
    fn run_jobs(
        &self,
        call: &JobsCall,
    ) -> impl Future<Output = Result<Vec<JobsReply>, Self::Error>> + Send;

    /// Blocks the seller whose block key is `key` for `dur_us` from now
    /// (never shortening a longer block); returns when the block ends (µs).
    fn block(
        &self,
        key: &str,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;
}
