//! One call of the limiter script, as data.
//!
//! The call is built here, in plain Rust, and run by a [`Store`](super::Store): Redis
//! ([`RedisStore`](super::RedisStore)) in the product. Tests run the same
//! calls on the reference model (`limiter::testkit` and `limiter::local`,
//! e.g. the simulation's store). The local fallback does not go through a
//! [`Store`](super::Store): it decides job by job in memory (`limiter::local`). Nothing in
//! this file knows how Redis is reached.

use std::time::Duration;

use super::learn::{Blocked, Learnt};
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
/// job-list driver, the entry point (`limiter_call`), then the block. It only
/// defines functions (`limiter_call`, `block_call`); the tails below run
/// them.
macro_rules! library_body {
    () => {
        concat!(
            shape_body!(),
            include_str!("../../lua/slots.lua"),
            include_str!("../../lua/jobs.lua"),
            include_str!("../../lua/restore.lua"),
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

/// Where one rule's state lives (see `lua/common.lua`): the fields
/// `<place>:…` of the hash `key`, which holds the seller's block and every
/// rule's state (`r<i>` enforced, `s<i>` shadow rules).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateKey {
    pub key: String,
    pub place: String,
}

impl StateKey {
    pub fn new(key: impl Into<String>, place: impl Into<String>) -> StateKey {
        StateKey {
            key: key.into(),
            place: place.into(),
        }
    }

    /// One name for the state: `key#place` (a place never holds `#`).
    /// The reference model stores each state under it.
    pub fn address(&self) -> String {
        format!("{}#{}", self.key, self.place)
    }
}

/// How a call reads the seller's downstream 429 block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockRead {
    /// The `block` field of the seller's hash.
    Field,
    /// Not read: shadow rules, `limits show`'s per-rule reads, the global
    /// rules' own call.
    Ignore,
}

/// The key a call names first (the seller's hash, or the global rules'),
/// and whether the block is read there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockAt {
    pub key: String,
    pub read: BlockRead,
}

impl BlockAt {
    pub fn new(key: impl Into<String>, read: BlockRead) -> BlockAt {
        BlockAt {
            key: key.into(),
            read,
        }
    }

    /// The request's block token (`lua/jobs.lua`).
    pub(crate) fn wire(&self) -> &'static str {
        match self.read {
            BlockRead::Field => "f",
            BlockRead::Ignore => "-",
        }
    }

    /// ARGV of [`BLOCK_LUA`] (`lua/block.lua`): `now_us` (`''`: Redis'
    /// clock), the duration (at least 1 µs), the block token.
    pub fn block_args(&self, now_us: Option<u64>, dur_us: u64) -> Vec<String> {
        vec![
            now_us.map(|n| n.to_string()).unwrap_or_default(),
            dur_us.max(1).to_string(),
            self.wire().to_owned(),
        ]
    }

    /// The model's name for the block: `None` when it is not read.
    pub fn address(&self) -> Option<String> {
        match self.read {
            BlockRead::Field => Some(format!("{}#block", self.key)),
            BlockRead::Ignore => None,
        }
    }
}

/// A rule with where its state lives.
pub type KeyedRule = (StateKey, Rule);

/// A refund of units an earlier jobs request charged (`lua/limiter.lua`,
/// 'refund'): Redis Cluster, where the global rules cut the prefix the
/// seller's rules granted. Only what is provably unused comes back (see
/// `lua/common.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundCall {
    /// The refund's own time: at or after every call since the take
    /// (`None` = Redis' clock, production).
    pub now_us: Option<u64>,
    /// Units to give back (>= 1).
    pub units: u64,
    /// How many of the request's units to skip (they stay charged).
    pub skip: u64,
    /// The `now_us` the jobs call replied with.
    pub taken_at_us: u64,
    /// The request's call id, its block and its rules.
    pub call_id: String,
    pub block: BlockAt,
    pub rules: Vec<KeyedRule>,
}

impl RefundCall {
    /// KEYS: the request's first key, then one per rule.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.block.key.as_str()).chain(rule_keys(&self.rules))
    }

    /// ARGV, as `lua/limiter.lua` documents it.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "refund".to_owned(),
            self.now_us.map(|n| n.to_string()).unwrap_or_default(),
            self.units.to_string(),
            self.skip.to_string(),
            self.call_id.clone(),
            self.block.wire().to_owned(),
            self.rules.len().to_string(),
        ];
        push_rules(&mut args, &self.rules);
        args.push(self.taken_at_us.to_string());
        args
    }
}

/// What a restore writes back after ([`RestoreCall`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Redis lost its data: the epoch as the replica read it (µs).
    Epoch(u64),
    /// A seller's state went back to an older copy (a failover to a
    /// replica that missed writes), found at `found_us`
    /// (`rollback_hold`, `lua/common.lua`).
    Rollback { found_us: u64 },
}

impl Loss {
    /// Its `ARGV[4]` (`lua/restore.lua`).
    fn wire(self) -> String {
        match self {
            Loss::Epoch(at) => at.to_string(),
            Loss::Rollback { found_us } => format!("r{found_us}"),
        }
    }

    /// The instant that names it: the epoch, or the find.
    pub fn at_us(self) -> u64 {
        match self {
            Loss::Epoch(at) | Loss::Rollback { found_us: at } => at,
        }
    }
}

/// A replica's part of a seller's state written back after a loss
/// (`lua/restore.lua`): per rule, what this replica was granted before
/// the loss, as `(µs on Redis' clock, units)`, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreCall {
    /// µs since the epoch; `None` reads Redis' clock (production).
    pub now_us: Option<u64>,
    /// The replica's name: its part counts once per loss.
    pub replica: String,
    /// The loss restored.
    pub loss: Loss,
    /// `redis.state_loss_wait` (µs): the hold ends at the loss plus it.
    pub bound_us: u64,
    /// The epoch key, in the slot of the rules' keys.
    pub epoch: String,
    /// The server key ([`KeySpace::server`](super::keys::KeySpace::server)):
    /// a rollback's find may name every hash (the server moved). `None` in
    /// a cluster, where it lies in another slot than the rules' keys (and
    /// no rollback is restored there).
    pub server: Option<String>,
    pub rules: Vec<(KeyedRule, Vec<(u64, u64)>)>,
    /// The replica's tag and its last grant in the hash (µs): written as
    /// its mark, so that its next call does not find the loss again.
    pub mark: Option<(String, u64)>,
}

impl RestoreCall {
    /// KEYS: one per rule, then the epoch key, then the server key (when
    /// there is one).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .map(|((at, _), _)| at.key.as_str())
            .chain([self.epoch.as_str()])
            .chain(self.server.as_deref())
    }

    /// ARGV, as `lua/restore.lua` documents it.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "restore".to_owned(),
            self.now_us.map(|n| n.to_string()).unwrap_or_default(),
            self.replica.clone(),
            self.loss.wire(),
            self.bound_us.to_string(),
            self.rules.len().to_string(),
        ];
        push_rules(&mut args, self.rules.iter().map(|(r, _)| r));
        for (_, part) in &self.rules {
            let wire: Vec<String> = part.iter().map(|(at, n)| format!("{at}:{n}")).collect();
            args.push(wire.join(","));
        }
        if let Some((tag, last)) = &self.mark {
            args.push(tag.clone());
            args.push(last.to_string());
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
    /// This install is new (its consumer group never committed): an epoch
    /// found gone is written as "never lost", and no seller waits.
    pub new_install: bool,
    /// The longest a loss holds a seller, µs (`redis.state_loss_wait`):
    /// a rule whose whole use would count longer is held unwritten until
    /// the loss plus this, then starts fresh. `None`: a whole use.
    pub max_wait_us: Option<u64>,
    /// This replica's last grant per request, which a partial loss may
    /// have taken back (`rollback_hold`, `lua/common.lua`). `None`: no
    /// partial loss is looked for.
    pub seen: Option<Seen>,
}

/// What a call carries to find a partial loss: per request, this
/// replica's last grant in the seller's hash and until when that hash
/// must live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The replica's short name in marks (`w:<tag>`).
    pub tag: String,
    /// Where finds are listed ([`KeySpace::rollbacks`](super::keys::KeySpace::rollbacks)).
    pub rollbacks: String,
    /// The server key ([`KeySpace::server`](super::keys::KeySpace::server)).
    pub server: String,
    /// Per request: `(granted at, live until)`, µs on Redis' clock.
    pub marks: Vec<Option<(u64, u64)>>,
}

impl Seen {
    /// The seen token (`parse_seen`, `lua/common.lua`).
    pub fn wire(&self) -> String {
        let entries: Vec<String> = self
            .marks
            .iter()
            .map(|m| match m {
                Some((at, live)) => format!("{at}:{live}"),
                None => "-".to_owned(),
            })
            .collect();
        format!("{} {}", self.tag, entries.join(","))
    }
}

impl LossGuard {
    /// The guard's token in ARGV (`parse_guard` of `lua/common.lua`):
    /// `wait` or `admit`, then `+new`, then `~<µs>`.
    pub fn wire(&self) -> String {
        let mut token = self.on_loss.wire().to_owned();
        if self.new_install {
            token.push_str("+new");
        }
        if let Some(max) = self.max_wait_us {
            token.push('~');
            token.push_str(&max.to_string());
        }
        token
    }
}

impl JobsCall {
    /// KEYS: per request its block key, then one per rule, then its
    /// slots' when capped; last, with a loss guard, the epoch key.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.requests
            .iter()
            .flat_map(|q| {
                std::iter::once(q.block.key.as_str())
                    .chain(rule_keys(&q.rules))
                    .chain(q.slots.as_ref().map(|s| s.key.as_str()))
            })
            .chain(self.guard.as_ref().map(|g| g.epoch.as_str()))
            .chain(
                self.seen()
                    .into_iter()
                    .flat_map(|s| [s.rollbacks.as_str(), s.server.as_str()]),
            )
    }

    /// The partial-loss marks the call carries, if any.
    fn seen(&self) -> Option<&Seen> {
        self.guard.as_ref()?.seen.as_ref()
    }

    /// The ARGV that follow [`JobsCall::args`]: the deadline (µs on
    /// Redis' clock), the life of the call's record (µs), the loss guard,
    /// the learn terms and the seen token, each `''` when absent; the
    /// absent ones after the life left out, and nothing when all are.
    pub fn tail(&self, deadline_us: Option<i64>, life_us: Option<u64>) -> Vec<String> {
        let mut tail = vec![
            deadline_us.map(|d| d.to_string()),
            life_us.map(|l| l.to_string()),
            self.guard.as_ref().map(LossGuard::wire),
            self.learn.map(|rise| rise.to_string()),
            self.seen().map(Seen::wire),
        ];
        // The deadline and the life go together (as before the guard).
        while tail.len() > 2 && tail.last().is_some_and(Option::is_none) {
            tail.pop();
        }
        if tail.iter().all(Option::is_none) {
            return Vec::new();
        }
        tail.into_iter().map(Option::unwrap_or_default).collect()
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

/// The ARGV of a new install's epoch write ('install', `lua/limiter.lua`).
pub fn install_args() -> Vec<String> {
    vec!["install".to_owned(), String::new()]
}

/// Per rule the key of its hash.
fn rule_keys(rules: &[KeyedRule]) -> impl Iterator<Item = &str> {
    rules.iter().map(|(k, _)| k.key.as_str())
}

/// Per rule: algorithm, limit, period_us, burst, place.
fn push_rules<'a>(args: &mut Vec<String>, rules: impl IntoIterator<Item = &'a KeyedRule>) {
    for (at, r) in rules {
        args.push(r.algorithm().name().to_owned());
        args.push(r.limit().to_string());
        args.push(r.period_us().to_string());
        args.push(r.burst().to_string());
        args.push(at.place.clone());
    }
}

/// One downstream block with its learn drop ([`Store::block_learning`](super::Store::block_learning)).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(guard: Option<LossGuard>, learn: Option<u64>) -> JobsCall {
        JobsCall {
            now_us: None,
            dry_run: false,
            requests: Vec::new(),
            guard,
            learn,
        }
    }

    fn guard(seen: Option<Seen>) -> LossGuard {
        LossGuard {
            epoch: "e".to_owned(),
            on_loss: OnStateLoss::Wait,
            new_install: false,
            max_wait_us: Some(3_000_000),
            seen,
        }
    }

    #[test]
    fn the_tail_keeps_its_places_and_drops_what_trails_absent() {
        assert!(call(None, None).tail(None, None).is_empty());
        assert_eq!(call(None, None).tail(Some(5), None), ["5", ""]);
        assert_eq!(call(None, Some(7)).tail(None, None), ["", "", "", "7"]);
        assert_eq!(
            call(Some(guard(None)), None).tail(Some(5), Some(9)),
            ["5", "9", "wait~3000000"]
        );
        let seen = Seen {
            tag: "0a0b0c0d".to_owned(),
            rollbacks: "tw:{epoch}:rolled".to_owned(),
            server: "tw:{epoch}:server".to_owned(),
            marks: vec![Some((10, 20)), None],
        };
        let c = call(Some(guard(Some(seen))), None);
        assert_eq!(
            c.tail(None, None),
            ["", "", "wait~3000000", "", "0a0b0c0d 10:20,-"],
            "the seen token after an empty learn term"
        );
        assert_eq!(
            c.keys().collect::<Vec<_>>(),
            ["e", "tw:{epoch}:rolled", "tw:{epoch}:server"],
            "the rollbacks and server keys right after the epoch"
        );
    }

    #[test]
    fn a_restore_names_its_loss_and_carries_the_mark_last() {
        let rule = (
            StateKey::new("s", "r0"),
            Rule::new(
                crate::limiter::Algorithm::FixedWindow,
                10,
                Duration::from_secs(60),
                None,
            )
            .expect("a rule"),
        );
        let mut r = RestoreCall {
            now_us: None,
            replica: "a".to_owned(),
            loss: Loss::Rollback { found_us: 42 },
            bound_us: 3,
            epoch: "e".to_owned(),
            server: Some("s".to_owned()),
            rules: vec![(rule, vec![(1, 2), (3, 4)])],
            mark: Some(("t".to_owned(), 3)),
        };
        let args = r.args();
        assert_eq!(args[3], "r42");
        assert_eq!(&args[args.len() - 3..], ["1:2,3:4", "t", "3"]);
        r.loss = Loss::Epoch(7);
        r.mark = None;
        let args = r.args();
        assert_eq!(
            (args[3].as_str(), args.last().map(String::as_str)),
            ("7", Some("1:2,3:4"))
        );
    }
}
