//! One call of the limiter script, as data.
//!
//! The call is built here, in plain Rust, and run by a [`Store`]: Redis
//! ([`RedisStore`](super::RedisStore)) in the product. Tests run the same
//! calls on the reference model (`limiter::testkit` and `limiter::local`,
//! e.g. the simulation's store). The local fallback does not go through a
//! [`Store`]: it decides job by job in memory (`limiter::local`). Nothing in
//! this file knows how Redis is reached.

use std::future::Future;
use std::time::Duration;

use super::decision::Mode;
use super::learn::{Blocked, Learnt};
use super::reply::{JobsReply, Reply};
use super::rule::Rule;
use crate::config::OnStateLoss;

/// What a generated shape needs ([`SHAPE_BODY`]): the helpers, one file
/// per algorithm, the call records.
macro_rules! shape_body {
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
            include_str!("../../lua/learn.lua"),
            include_str!("../../lua/calls.lua"),
        )
    };
}

/// The limiter's Lua, as one library: [`SHAPE_BODY`], the slots, the
/// job-list driver, the single-call driver, then the block. It only
/// defines functions (`limiter_call`, `block_call`); the tails below run
/// them.
macro_rules! library_body {
    () => {
        concat!(
            shape_body!(),
            include_str!("../../lua/slots.lua"),
            include_str!("../../lua/jobs.lua"),
            include_str!("../../lua/limiter.lua"),
            include_str!("../../lua/block.lua"),
        )
    };
}

/// The library's definitions, shared by the EVAL scripts and the Redis
/// Functions library.
pub const LIBRARY_BODY: &str = library_body!();

/// What a generated call shape's driver (`limiter::shape`) calls: the
/// helpers, every algorithm (a rule edit converts from any of them) and
/// the call records; not the general drivers, slots or the block. Each
/// shape's library carries it, so it is kept to what they use.
pub const SHAPE_BODY: &str = shape_body!();

/// The limiter as an EVAL script (servers without Redis Functions, or an
/// ACL user without `FUNCTION LOAD`). Every call runs the definitions again
/// (about 60 closures), which is why Functions are preferred.
pub const LIMITER_LUA: &str = concat!(library_body!(), "\nreturn limiter_call(KEYS, ARGV)\n");

/// Sets a seller's downstream block, as an EVAL script (with the helpers
/// it shares with the limiter).
pub const BLOCK_LUA: &str = concat!(
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/learn.lua"),
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
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
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

/// Where one rule's state lives (see `lua/common.lua`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateKey {
    pub key: String,
    /// `None`: state v1, a key of the rule's own whose name carries the
    /// rule's fingerprint. `Some(place)`: state v2, the fields `<place>:…`
    /// of the hash `key`, which holds the seller's block and every rule's
    /// state (`r<i>` enforced, `s<i>` shadow rules).
    pub place: Option<String>,
    /// State v1+v2 (a rolling deploy): the rule's v1 key, read beside the
    /// place and charged with it. `None` otherwise.
    pub also: Option<String>,
}

impl StateKey {
    /// A v1 key of the rule's own.
    pub fn own(key: impl Into<String>) -> StateKey {
        StateKey {
            key: key.into(),
            place: None,
            also: None,
        }
    }

    /// A place in a v2 hash.
    pub fn place(key: impl Into<String>, place: impl Into<String>) -> StateKey {
        StateKey {
            key: key.into(),
            place: Some(place.into()),
            also: None,
        }
    }

    /// A place in a v2 hash with the rule's v1 key beside it (v1+v2).
    pub fn both(
        key: impl Into<String>,
        place: impl Into<String>,
        v1: impl Into<String>,
    ) -> StateKey {
        StateKey {
            also: Some(v1.into()),
            ..StateKey::place(key, place)
        }
    }

    /// One name for the state, unique across layouts: the key (v1), or
    /// `key#place` (v2; a place never holds `#`). The reference model
    /// stores each state under it.
    pub fn address(&self) -> String {
        match &self.place {
            None => self.key.clone(),
            Some(place) => format!("{}#{place}", self.key),
        }
    }
}

impl From<String> for StateKey {
    fn from(key: String) -> StateKey {
        StateKey::own(key)
    }
}

impl From<&str> for StateKey {
    fn from(key: &str) -> StateKey {
        StateKey::own(key)
    }
}

/// How a call reads the seller's downstream 429 block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockRead {
    /// v1: a key of its own holds the block's end.
    Key,
    /// v2: the `block` field of the seller's hash.
    Field,
    /// Not read: shadow rules, `limits show`'s per-rule reads, the global
    /// rules' own call.
    Ignore,
}

impl BlockAt {
    /// The request's block token (`lua/limiter.lua`): upper case (`F`,
    /// `=`) when a v1 block key follows the first key (v1+v2).
    pub(crate) fn wire(&self) -> &'static str {
        match (self.read, self.also.is_some()) {
            (BlockRead::Key, _) => "k",
            (BlockRead::Field, false) => "f",
            (BlockRead::Field, true) => "F",
            (BlockRead::Ignore, false) => "-",
            (BlockRead::Ignore, true) => "=",
        }
    }

    /// The first key, then the v1 block key in v1+v2: a limiter call's
    /// first KEYS, and the KEYS of [`BLOCK_LUA`].
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key.as_str()).chain(self.also.as_deref())
    }

    /// ARGV of [`BLOCK_LUA`] (`lua/block.lua`): `now_us` (`''`: Redis'
    /// clock), the duration (at least 1 µs), the block token. It names the
    /// block with the same token and keys as a limiter call does, so it
    /// writes both layouts in v1+v2.
    pub fn block_args(&self, now_us: Option<u64>, dur_us: u64) -> Vec<String> {
        vec![
            now_us.map(|n| n.to_string()).unwrap_or_default(),
            dur_us.max(1).to_string(),
            self.wire().to_owned(),
        ]
    }
}

/// The key a call names first (its block key, or the seller's hash), and
/// how the block is read there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockAt {
    pub key: String,
    pub read: BlockRead,
    /// v1+v2: the seller's v1 block key, read (and written) beside the
    /// hash's field.
    pub also: Option<String>,
}

impl BlockAt {
    /// A v1 block key.
    pub fn key(key: impl Into<String>) -> BlockAt {
        BlockAt {
            key: key.into(),
            read: BlockRead::Key,
            also: None,
        }
    }

    /// The model's name for the block: `None` when it is not read.
    pub fn address(&self) -> Option<String> {
        match self.read {
            BlockRead::Key => Some(self.key.clone()),
            BlockRead::Field => Some(format!("{}#block", self.key)),
            BlockRead::Ignore => None,
        }
    }
}

impl From<String> for BlockAt {
    fn from(key: String) -> BlockAt {
        BlockAt::key(key)
    }
}

impl From<&str> for BlockAt {
    fn from(key: &str) -> BlockAt {
        BlockAt::key(key)
    }
}

/// A rule with where its state lives.
pub type KeyedRule = (StateKey, Rule);

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
    pub block: BlockAt,
    /// Each rule with where its state lives.
    pub rules: Vec<KeyedRule>,
}

impl ScriptCall {
    /// KEYS of the script: the block key (and v1's in v1+v2), then one
    /// per rule (two in v1+v2: the place's hash and the v1 key).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.block.keys().chain(rule_keys(&self.rules))
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
            self.block.wire().to_owned(),
            self.rules.len().to_string(),
        ];
        push_rules(&mut args, &self.rules);
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
    pub block: BlockAt,
    /// Each rule with where its state lives.
    pub rules: Vec<KeyedRule>,
    /// At least one, each >= 1.
    pub costs: Vec<u64>,
    /// The seller's `max_in_flight`, when capped.
    pub slots: Option<SlotTerms>,
}

/// A request's calls-in-flight cap (`lua/slots.lua`): each granted job
/// also takes a slot, leased until `lease_us` after its go-at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTerms {
    /// The seller's sorted set of leases.
    pub key: String,
    /// `max_in_flight`, >= 1.
    pub max: u32,
    pub lease_us: u64,
    /// The retry-after of a job refused for want of a slot: slots come
    /// back with answers, which no replica is told of, so it looks again.
    pub poll_us: u64,
}

impl SlotTerms {
    fn wire(&self) -> String {
        format!("{},{},{}", self.max, self.lease_us, self.poll_us)
    }

    /// The lease of the `j`-th (0-based) granted job of call `call_id`.
    pub fn lease(call_id: &str, j: usize) -> String {
        format!("{call_id}:{}", j + 1)
    }
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
    /// Whether and how the call guards against Redis having lost the
    /// limiter's state (`redis.on_state_loss`); `None` reads lost state as
    /// fresh and reports nothing (tests of the algorithms).
    pub guard: Option<LossGuard>,
    /// The rise of a learnt factor, ppm per second (`limits.learn`): each
    /// v2 request runs on its seller's learnt rules (`lua/learn.lua`).
    /// `None`: the configured rules as they are.
    pub learn: Option<u64>,
}

/// The loss guard of a jobs call (`lua/jobs.lua`): the epoch key, which
/// only a loss of Redis' data removes, and what a loss means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LossGuard {
    /// In the hash slot of every other key of the call
    /// ([`KeySpace::epoch`](super::keys::KeySpace::epoch)).
    pub epoch: String,
    pub on_loss: OnStateLoss,
}

impl JobsCall {
    /// KEYS: per request its block key, then one per rule, then its
    /// slots' when capped; last, with a loss guard, the epoch key.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.requests
            .iter()
            .flat_map(|q| {
                q.block
                    .keys()
                    .chain(rule_keys(&q.rules))
                    .chain(q.slots.as_ref().map(|s| s.key.as_str()))
            })
            .chain(self.guard.as_ref().map(|g| g.epoch.as_str()))
    }

    /// The ARGV that follow [`JobsCall::args`]: the deadline (µs on
    /// Redis' clock), the life of the call's record (µs), the loss guard
    /// and the learn terms, each `''` when absent; nothing when all are.
    pub fn tail(&self, deadline_us: Option<i64>, life_us: Option<u64>) -> Vec<String> {
        let guard = self.guard.as_ref().map(|g| g.on_loss.wire());
        if deadline_us.is_none() && life_us.is_none() && guard.is_none() && self.learn.is_none() {
            return Vec::new();
        }
        let mut tail = vec![
            deadline_us.map(|d| d.to_string()).unwrap_or_default(),
            life_us.map(|l| l.to_string()).unwrap_or_default(),
        ];
        if guard.is_some() || self.learn.is_some() {
            tail.push(guard.unwrap_or_default().to_owned());
        }
        tail.extend(self.learn.map(|rise| rise.to_string()));
        tail
    }

    /// ARGV as the call is sent: [`JobsCall::args`] then
    /// [`JobsCall::tail`]. The product and the simulation's embedded Redis
    /// both send this, so the script runs the same arguments in both.
    pub fn wire_args(&self, deadline_us: Option<i64>, life_us: Option<u64>) -> Vec<String> {
        let mut args = self.args();
        args.extend(self.tail(deadline_us, life_us));
        args
    }

    /// ARGV of this call's cancel as it is sent: [`JobsCall::cancel_args`],
    /// then, on Redis' clock, no deadline (a cancel is welcome whenever it
    /// runs) and the record's life `life_us`. No guard: a cancel gives
    /// back, it decides nothing.
    pub fn cancel_wire_args(&self, life_us: u64) -> Vec<String> {
        let mut args = self.cancel_args();
        if self.now_us.is_none() {
            args.push(String::new());
            args.push(life_us.to_string());
        }
        args
    }

    /// ARGV, as `lua/jobs.lua` documents it.
    pub fn args(&self) -> Vec<String> {
        let op = if self.dry_run { "jobs_peek" } else { "jobs" };
        self.args_with(op)
    }

    /// ARGV of the `cancel` of this call (`lua/calls.lua`): the same
    /// requests; each gets back what this call charged it, or, when this
    /// call has not run yet, makes it charge nothing.
    pub fn cancel_args(&self) -> Vec<String> {
        self.args_with("cancel")
    }

    fn args_with(&self, op: &str) -> Vec<String> {
        let mut args = vec![
            op.to_owned(),
            self.now_us.map(|n| n.to_string()).unwrap_or_default(),
            self.requests.len().to_string(),
        ];
        for q in &self.requests {
            args.push(q.call_id.clone());
            let costs: Vec<String> = q.costs.iter().map(u64::to_string).collect();
            args.push(costs.join(","));
            args.push(q.block.wire().to_owned());
            args.push(q.rules.len().to_string());
            push_rules(&mut args, &q.rules);
            args.push(q.slots.as_ref().map(SlotTerms::wire).unwrap_or_default());
        }
        args
    }
}

/// How long a jobs call's record stays for its cancel (µs), for a store
/// whose calls time out after `timeout`: a few timeouts, as the cancel goes
/// out as soon as the call times out. At least a second, for the cancel of
/// a call on a connection being replaced.
pub fn call_life_us(timeout: Duration) -> u64 {
    let life = (timeout * 4).max(Duration::from_secs(1));
    u64::try_from(life.as_micros()).unwrap_or(u64::MAX)
}

/// ARGV of the limiter's `release` (`lua/slots.lua`): the leases given back.
pub fn release_args(leases: &[String]) -> Vec<String> {
    let mut args = Vec::with_capacity(leases.len() + 1);
    args.push("release".to_owned());
    args.extend(leases.iter().cloned());
    args
}

/// Per rule its key, and its v1 key in v1+v2.
fn rule_keys(rules: &[KeyedRule]) -> impl Iterator<Item = &str> {
    rules
        .iter()
        .flat_map(|(k, _)| std::iter::once(k.key.as_str()).chain(k.also.as_deref()))
}

/// Per rule: algorithm, limit, period_us, burst, place ('' for v1).
fn push_rules(args: &mut Vec<String>, rules: &[KeyedRule]) {
    for (at, r) in rules {
        args.push(r.algorithm().name().to_owned());
        args.push(r.limit().to_string());
        args.push(r.period_us().to_string());
        args.push(r.burst().to_string());
        args.push(at.place.clone().unwrap_or_default());
    }
}

/// Where the limiter's state lives.
pub trait Store: Clone + Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether a failed call may have run on the server all the same, its
    /// reply lost on the way back (a timeout, a dropped connection): the
    /// limiter then gives back what a jobs call charged
    /// ([`cancel_jobs`](Self::cancel_jobs)). A store whose failures always
    /// come before the script runs says no (the default).
    fn may_have_run(_e: &Self::Error) -> bool {
        false
    }

    /// Runs one limiter call.
    fn run(&self, call: &ScriptCall) -> impl Future<Output = Result<Reply, Self::Error>> + Send;

    /// Runs one jobs call: one reply per request, in order.
    fn run_jobs(
        &self,
        call: &JobsCall,
    ) -> impl Future<Output = Result<Vec<JobsReply>, Self::Error>> + Send;

    /// Gives back slots of `max_in_flight` (`leases` of the sorted set at
    /// `key`); returns how many were still held (not lapsed or given back).
    fn release(
        &self,
        key: &str,
        leases: &[String],
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;
    /// Cancels a jobs call whose answer never reached its caller (see
    /// [`JobsCall::cancel_args`]): one integer per request, the units given
    /// back, -1 for a tombstone left before the call ran, 0 for nothing
    /// done. A store that records no calls cancels nothing (the default).
    fn cancel_jobs(
        &self,
        call: &JobsCall,
    ) -> impl Future<Output = Result<Vec<i64>, Self::Error>> + Send {
        let n = call.requests.len();
        async move { Ok(vec![0; n]) }
    }

    /// Makes ready the generated functions of `shapes` (`limiter::shape`)
    /// before a call needs one: at startup and after a reload of the
    /// limits. A store without them does nothing (the default).
    fn prepare_shapes(
        &self,
        _shapes: &[super::shape::Shape],
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        async { Ok(()) }
    }

    /// The store's clock at `now` (this host's monotonic instant), as last
    /// learnt: Redis' `TIME` run forward on the monotonic clock, which no
    /// step of the host's wall clock moves. `None` until learnt, and for a
    /// store with no clock of its own (the default).
    fn unix_us_at(&self, _now: tokio::time::Instant) -> Option<u64> {
        None
    }

    /// Blocks the seller whose block is at `at` for `dur_us` from now
    /// (never shortening a longer block); returns when the block ends (µs).
    fn block(
        &self,
        at: &BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// [`Store::block`] with the drop of the seller's learnt limit a 429
    /// brings (`limits.learn`, `lua/block.lua`'s `ARGV[4]`). A store that
    /// learns nothing blocks only (the default).
    fn block_learning(
        &self,
        at: &BlockAt,
        call: &BlockCall,
    ) -> impl Future<Output = Result<Blocked, Self::Error>> + Send {
        async move {
            let until_us = self.block(at, call.now_us, call.dur_us).await?;
            Ok(Blocked {
                until_us,
                learnt: None,
            })
        }
    }
}

/// One downstream block with its learn drop ([`Store::block_learning`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockCall {
    /// µs since the epoch; `None` reads Redis' clock (production).
    pub now_us: Option<u64>,
    pub dur_us: u64,
    /// `lua/block.lua`'s `ARGV[4]` ([`drop_wire`](super::learn::LearnTerms::drop_wire)); `None`:
    /// no learning.
    pub learn: Option<String>,
}

impl BlockCall {
    /// ARGV of [`BLOCK_LUA`] for `at`.
    pub fn args(&self, at: &BlockAt) -> Vec<String> {
        let mut args = at.block_args(self.now_us, self.dur_us);
        args.extend(self.learn.clone());
        args
    }

    /// Reads the script's reply: the block's end, or with a learn drop
    /// `[until, factor ppm, dropped]`.
    pub fn read(&self, reply: &[i64]) -> Option<Blocked> {
        match (reply, &self.learn) {
            ([until], None) => Some(Blocked {
                until_us: u64::try_from(*until).ok()?,
                learnt: None,
            }),
            ([until, factor, dropped], Some(_)) => Some(Blocked {
                until_us: u64::try_from(*until).ok()?,
                learnt: Some(Learnt {
                    factor_ppm: u64::try_from(*factor).ok()?,
                    dropped: *dropped == 1,
                }),
            }),
            _ => None,
        }
    }
}
