//! Straight-line Lua per call shape (issue 37).
//!
//! The general library (`lua/jobs.lua`) reads every request's rules into
//! tables, dispatches per algorithm through them, loops over the rules for
//! every figure and answers 13 integers per request, whatever the call
//! needs. Most calls have one of a few shapes: a charging jobs call of
//! sellers, each with the same algorithms in its own hash, and
//! no shadow rule, no global rule, no `max_in_flight` in the request. For
//! such a shape this module writes one function whose rules are unrolled
//! (the algorithm of each place is bound when the library loads, the
//! positions of every argument and key are constants) and whose reply holds
//! only what the caller reads: the call's `now` once, then ten integers per
//! request ([`JobsAnswer::from_compact`]).
//!
//! The function is the general library's own code around it: the same
//! `load`/`avail`/`take` of each algorithm, the same `settle` on an edited
//! rule, the same loss guard, tombstones and call records (`lua/calls.lua`),
//! the same `flush`. Only the driver is generated, so the agreement tests
//! that hold the general driver to the Rust model hold each shape too (the
//! product sends every call of a shape through it, tests included).
//!
//! Anything else (a dry run, a cancel, a request that does not read the block, slots, global
//! rules, more than [`MAX_RULES`] rules, a call mixing shapes) runs the
//! general function: [`Shape::of_call`] says `None`.

use super::reply::{EpochFound, JobsAnswer, JobsReply, MalformedReply, Reply};
use super::rule::Algorithm;
use super::script::{BlockRead, JobsCall, JobsRequest, SHAPE_BODY};

/// The most rules a generated shape unrolls; a seller with more runs the
/// general function.
pub const MAX_RULES: usize = 4;

/// Integers per request in a shape's reply.
pub const ROW: usize = 10;

/// The algorithms of one request's rules, in order, all at places `r0`,
/// `r1`, … of the seller's own hash. Every request of a call of this shape
/// has them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    algorithms: Vec<Algorithm>,
}

impl Shape {
    /// The shape of a seller's request over `algorithms` (at most
    /// [`MAX_RULES`]).
    pub fn new(algorithms: Vec<Algorithm>) -> Option<Shape> {
        (algorithms.len() <= MAX_RULES).then_some(Shape { algorithms })
    }

    /// The call's shape when a generated function can run it: a charging
    /// call whose requests all have the same one.
    pub fn of_call(call: &JobsCall) -> Option<Shape> {
        if call.dry_run {
            return None;
        }
        let mut requests = call.requests.iter();
        let shape = Shape::of_request(requests.next()?)?;
        requests
            .all(|q| Shape::of_request(q).as_ref() == Some(&shape))
            .then_some(shape)
    }

    /// A request that reads the block in the seller's hash (where its calls
    /// are recorded too), with no slots, and every rule at place `r<i>` of
    /// that hash (global rules live in a hash of their own: not this shape).
    fn of_request(q: &JobsRequest) -> Option<Shape> {
        let plain = q.block.read == BlockRead::Field
            && q.slots.is_none()
            && q.rules
                .iter()
                .enumerate()
                .all(|(i, (at, _))| at.key == q.block.key && at.place == format!("r{i}"));
        if !plain {
            return None;
        }
        Shape::new(q.rules.iter().map(|(_, r)| r.algorithm()).collect())
    }

    /// Its name in function names: the algorithms' short names joined by
    /// `_`, or `none` for a seller without rules.
    pub fn name(&self) -> String {
        if self.algorithms.is_empty() {
            return "none".to_owned();
        }
        self.algorithms
            .iter()
            .map(|a| short(*a))
            .collect::<Vec<_>>()
            .join("_")
    }

    /// Rules per request.
    pub fn rules(&self) -> usize {
        self.algorithms.len()
    }

    /// The generated driver: `shape_call(KEYS, ARGV)`, which reads the
    /// arguments [`JobsCall::wire_args`] builds and answers as
    /// [`JobsAnswer::from_compact`] reads. Appended to the general library.
    pub fn lua(&self) -> String {
        let mut g = Gen::default();
        g.header(self);
        g.request(self);
        g.driver(self);
        g.0
    }
}

/// A shape's Functions library: the general library's helpers and
/// algorithms ([`SHAPE_BODY`]) with the shape's driver, registered under a
/// name of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeLibrary {
    /// `throttle_<hash>_<shape>`.
    pub name: String,
    /// The FCALL name, `throttle_jobs_<hash>_<shape>`: function names are
    /// global in Redis, so the hash of the code keeps two versions apart.
    pub function: String,
    /// The `FUNCTION LOAD` payload.
    pub code: String,
}

impl ShapeLibrary {
    pub fn new(shape: &Shape) -> ShapeLibrary {
        let driver = shape.lua();
        let version = format!(
            "{:016x}",
            super::script::fnv1a(format!("{SHAPE_BODY}{driver}").as_bytes())
        );
        let shape_name = shape.name();
        let name = format!("throttle_{version}_{shape_name}");
        let function = format!("throttle_jobs_{version}_{shape_name}");
        let code = format!(
            "#!lua name={name}\n{SHAPE_BODY}\n{driver}\n\
             redis.register_function('{function}', shape_call)\n"
        );
        ShapeLibrary {
            name,
            function,
            code,
        }
    }
}

fn short(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindowLog => "swl",
        Algorithm::SlidingWindowCounter => "swc",
        Algorithm::TokenBucket => "tb",
        Algorithm::LeakyBucket => "lb",
        Algorithm::BurstFill => "bf",
        Algorithm::Gcra => "gcra",
    }
}

/// Whether the algorithm paces its units (`go` in its Lua table).
fn paces(a: Algorithm) -> bool {
    a == Algorithm::LeakyBucket
}

/// The Lua text, written line by line.
#[derive(Default)]
struct Gen(String);

impl Gen {
    fn line(&mut self, s: impl AsRef<str>) {
        self.0.push_str(s.as_ref());
        self.0.push('\n');
    }

    /// Per rule i (1-based): its algorithm `Ai`, its handle `Hi` at place
    /// `r<i-1>:` and its rule table `Qi`, made once per library load and
    /// filled per request (Redis runs one call at a time).
    fn header(&mut self, s: &Shape) {
        self.line(format!("-- generated: the jobs call of shape {}", s.name()));
        for (i, a) in s.algorithms.iter().enumerate() {
            let n = i + 1;
            self.line(format!("local A{n} = ALGO.{}", a.name()));
            self.line(format!("local H{n} = {{ p = 'r{i}:' }}"));
            self.line(format!("local Q{n} = {{ algo = A{n}, h = H{n} }}"));
        }
        self.line("local function shape_row(out, status, units, remaining, retry, reset, go_at, by, jobs, next, tight)");
        self.line("  local o = #out");
        self.line("  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = status, units, remaining, retry, reset");
        self.line("  out[o + 6], out[o + 7], out[o + 8], out[o + 9], out[o + 10] = go_at, by, jobs, next, tight");
        self.line("end");
    }

    /// `wait, wby`: µs until a job of `cost` fits after `taken` units, and
    /// the rule that needs the longest (the first of equals).
    fn wait_for(&mut self, s: &Shape, cost: &str, taken: &str, indent: &str) {
        self.line(format!("{indent}local wait, wby = 0, 0"));
        for n in 1..=s.rules() {
            self.line(format!("{indent}if v{n} - {taken} < {cost} then"));
            self.line(format!(
                "{indent}  local w = A{n}.wait(s{n}, Q{n}, now, {cost}, {taken})"
            ));
            self.line(format!("{indent}  if w > wait then wait, wby = w, {n} end"));
            self.line(format!("{indent}end"));
        }
    }

    /// `remaining, reset, tight` after `taken` units (the rule with the
    /// fewest left, the first of equals; 0 0 0 without rules).
    fn summary(&mut self, s: &Shape, taken: &str, indent: &str) {
        if s.rules() == 0 {
            self.line(format!("{indent}local remaining, reset, tight = 0, 0, 0"));
            return;
        }
        self.line(format!(
            "{indent}local remaining, reset, tight = A1.left(s1, Q1, now, {taken}), A1.reset(s1, Q1, now, {taken}), 1"
        ));
        for n in 2..=s.rules() {
            self.line(format!(
                "{indent}local left{n} = A{n}.left(s{n}, Q{n}, now, {taken})"
            ));
            self.line(format!(
                "{indent}if left{n} < remaining then remaining, tight = left{n}, {n} end"
            ));
            self.line(format!(
                "{indent}reset = math.max(reset, A{n}.reset(s{n}, Q{n}, now, {taken}))"
            ));
        }
    }

    /// One request, as `jobs_request` in `lua/jobs.lua` decides it, with
    /// its tombstone and its record (`lua/calls.lua`).
    fn request(&mut self, s: &Shape) {
        let k = s.rules();
        self.line(
            "local function shape_request(out, hashes, KEYS, ARGV, q, a, k, costs, now, G, life, real, rise)",
        );
        self.line("  local id, key = ARGV[a], KEYS[k]");
        self.line("  local H = open_hash(hashes, key)");
        self.line("  local until_ = num(hget(H, 'block'), 0)");
        self.line("  local tomb = hget(H, 'tomb')");
        self.line("  if tomb ~= nil and tomb_find(tomb, id, now, life) then");
        self.line("    return shape_row(out, 0, 0, 0, 0, 0, now, 0, 0, 1, 0)");
        self.line("  end");
        for n in 1..=k {
            let b = 5 * (n - 1);
            self.line(format!("  H{n}.key, H{n}.hash = key, H"));
            self.line(format!(
                "  Q{n}.limit, Q{n}.period, Q{n}.burst = tonumber(ARGV[a + {}]), tonumber(ARGV[a + {}]), tonumber(ARGV[a + {}])",
                b + 5,
                b + 6,
                b + 7
            ));
            self.line(format!("  local cap{n} = A{n}.cap(Q{n})"));
        }
        // A first job above a rule's capacity: answered before any state is
        // read, as the general driver does.
        for n in 1..=k {
            self.line(format!("  if costs[1] > cap{n} then"));
            self.line(format!(
                "    return shape_row(out, -1, 0, 0, 0, 0, now, {n}, 0, 2, 0)"
            ));
            self.line("  end");
        }
        for n in 1..=k {
            let b = 5 * (n - 1);
            self.line(format!("  Q{n}.name = ARGV[a + {}]", b + 4));
            self.line(format!(
                "  Q{n}.fp = ARGV[a + {}] .. ':' .. ARGV[a + {}] .. ':' .. ARGV[a + {}] .. ':' .. ARGV[a + {}]",
                b + 4,
                b + 5,
                b + 6,
                b + 7
            ));
        }
        // The rules learnt from 429s (learn.lua), scaled in place: `cap<n>`
        // stays the configured capacity, on which a job is never.
        if k > 0 {
            self.line("  local lv = rise ~= nil and hget(H, 'learn') or nil");
            self.line("  if lv ~= nil then");
            let digest = (1..=k)
                .map(|n| format!("Q{n}.fp"))
                .collect::<Vec<_>>()
                .join(" .. ',' .. ");
            self.line(format!(
                "    local f = learn_factor(lv, now, rise, {digest})"
            ));
            self.line("    if f < LEARN_FULL then");
            for n in 1..=k {
                self.line(format!("      local l{n} = learn_rule(Q{n}, f, costs[1])"));
                self.line(format!(
                    "      Q{n}.limit, Q{n}.burst = l{n}.limit, l{n}.burst"
                ));
            }
            self.line("    end");
            self.line("  end");
        }
        // A bounded loss (lost_fill) or a rollback (rollback_hold) holds
        // the list until `hold`, by rule `hby`.
        self.line("  local hold, hby = 0, 0");
        if k > 0 {
            self.line("  local held = rollback_hold(G, H, q, now)");
            self.line("  if held ~= nil then hold, hby = held, 1 end");
        }
        for n in 1..=k {
            // The place written by this very rule (the common case) needs
            // neither a conversion nor the loss guard's fill, unless a
            // restore holds it (`rh`, lua/restore.lua).
            self.line(format!(
                "  if hget(H, 'r{0}:fp') ~= Q{n}.fp or hget(H, 'r{0}:rh') then",
                n - 1
            ));
            self.line(format!("    settle(Q{n}, now)"));
            self.line("    if G ~= nil then");
            self.line(format!("      local held = lost_fill(Q{n}, G, now)"));
            self.line(format!(
                "      if held ~= nil and held > hold then hold, hby = held, {n} end"
            ));
            self.line("    end");
            self.line("  end");
            self.line(format!("  local s{n} = A{n}.load(H{n}, Q{n}, now)"));
            self.line(format!("  local v{n} = A{n}.avail(s{n}, Q{n}, now)"));
        }
        match k {
            0 => self.line("  local n = nil"),
            1 => self.line("  local n = v1"),
            _ => self.line(format!(
                "  local n = math.min({})",
                (1..=k)
                    .map(|n| format!("v{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        // A downstream block, or a loss's hold, refuses the whole list; the
        // wait is the longest of the block, the hold and the first job's own.
        self.line("  if until_ > now or hold > now then");
        self.line("    local block = math.max(0, until_ - now)");
        self.wait_for(s, "costs[1]", "0", "    ");
        self.summary(s, "0", "    ");
        self.line("    if hold - now > wait then wait, wby = hold - now, hby end");
        self.line("    if block > 0 and block >= wait then wait, wby = block, 0 end");
        self.line(
            "    return shape_row(out, 0, 0, 0, wait, math.max(block, hold - now, reset), now, wby, 0, 1, 0)",
        );
        self.line("  end");
        // The longest prefix that fits the tightest rule; a job above a
        // rule's capacity ends it.
        self.line("  local jobs, units, stop = 0, 0, 0");
        self.line("  for j = 1, #costs do");
        self.line("    local c = costs[j]");
        for n in 1..=k {
            let kw = if n == 1 { "if" } else { "elseif" };
            self.line(format!("    {kw} c > cap{n} then stop = {n}"));
        }
        if k > 0 {
            self.line("    end");
            self.line("    if stop > 0 or units + c > n then break end");
        }
        self.line("    jobs, units = j, units + c");
        self.line("  end");
        if k > 0 {
            self.line("  if jobs == 0 then");
            self.summary(s, "0", "    ");
            self.wait_for(s, "costs[1]", "0", "    ");
            self.line("    return shape_row(out, 0, 0, remaining, wait, reset, now, wby, 0, 1, 0)");
            self.line("  end");
        }
        self.line("  local go_at = now");
        for (i, a) in s.algorithms.iter().enumerate() {
            if paces(*a) {
                let n = i + 1;
                self.line(format!(
                    "  go_at = math.max(go_at, A{n}.go(s{n}, Q{n}, now))"
                ));
            }
        }
        self.summary(s, "units", "  ");
        self.line("  local retry, by, next = 0, 0, 0");
        self.line("  if jobs < #costs then");
        self.line("    if stop > 0 then");
        self.line("      by, next = stop, 2");
        self.line("    else");
        self.wait_for(s, "costs[jobs + 1]", "units", "      ");
        self.line("      retry, by, next = wait, wby, 1");
        self.line("    end");
        self.line("  end");
        for n in 1..=k {
            self.line(format!("  A{n}.take(H{n}, s{n}, Q{n}, now, units, id)"));
            self.line(format!(
                "  if hget(H, 'r{}:fp') ~= Q{n}.fp then put(H{n}, 'fp', Q{n}.fp) end",
                n - 1
            ));
        }
        if k > 0 {
            self.line("  calls_write(H, now, life, id, units)");
            let rules = (1..=k)
                .map(|n| format!("Q{n}"))
                .collect::<Vec<_>>()
                .join(", ");
            self.line(format!(
                "  if G ~= nil and G.tag ~= nil then mark_grant(G, H, now, {{ {rules} }}) end"
            ));
        }
        self.line(
            "  shape_row(out, 1, units, remaining, retry, reset, go_at, by, jobs, next, tight)",
        );
        self.line("end");
    }

    /// The call: every request read and checked before any is decided (a
    /// bad one refuses the call with nothing charged), the deadline, the
    /// loss guard, the requests in order, one `flush`.
    fn driver(&mut self, s: &Shape) {
        let k = s.rules();
        self.line("local function shape_call(KEYS, ARGV)");
        self.line("  if ARGV[1] ~= 'jobs' then");
        self.line(format!(
            "    return redis.error_reply('shape {} runs charging jobs calls only')",
            s.name()
        ));
        self.line("  end");
        self.line("  local now = clock_us(ARGV[2])");
        self.line("  local real = ARGV[2] == '' and now or nil");
        self.line("  local nreq = tonumber(ARGV[3])");
        self.line("  if nreq == nil or nreq < 1 then");
        self.line("    return redis.error_reply('a jobs call needs at least one request')");
        self.line("  end");
        self.line("  local all = {}");
        self.line("  local a = 4");
        self.line("  for q = 1, nreq do");
        self.line("    local costs = {}");
        self.line("    local list = ARGV[a + 1] or ''");
        self.line("    if string.find(list, ',', 1, true) == nil then");
        self.line("      costs[1] = tonumber(list)");
        self.line("    else");
        self.line("      for c in string.gmatch(list, '[^,]+') do");
        self.line("        costs[#costs + 1] = tonumber(c) or 0");
        self.line("      end");
        self.line("    end");
        self.line("    if #costs == 0 then");
        self.line("      return redis.error_reply('a request needs at least one job')");
        self.line("    end");
        self.line("    for j = 1, #costs do");
        self.line("      if costs[j] == nil or costs[j] < 1 then");
        self.line("        return redis.error_reply('cost must be at least 1')");
        self.line("      end");
        self.line("    end");
        self.line(format!(
            "    if ARGV[a + 2] ~= 'f' or tonumber(ARGV[a + 3]) ~= {k} or ARGV[a + {}] ~= '' then",
            4 + 5 * k
        ));
        self.line(format!(
            "      return redis.error_reply('request ' .. q .. ' is not of shape {}')",
            s.name()
        ));
        self.line("    end");
        for n in 1..=k {
            self.line(format!(
                "    if ALGO[ARGV[a + {}]] ~= A{n} then",
                4 + 5 * (n - 1)
            ));
            self.line(format!(
                "      return redis.error_reply('request ' .. q .. ' is not of shape {}')",
                s.name()
            ));
            self.line("    end");
        }
        self.line("    all[q] = costs");
        self.line(format!("    a = a + {}", 5 + 5 * k));
        self.line("  end");
        self.line("  local deadline = tonumber(ARGV[a] or '')");
        self.line("  local life = tonumber(ARGV[a + 1] or '') or CALL_LIFE_US");
        self.line("  local guard = ARGV[a + 2] or ''");
        self.line(format!("  local epoch = KEYS[nreq * {} + 1]", 1 + k));
        self.line("  local how, fresh, max = nil, false, nil");
        self.line("  if guard ~= '' then");
        self.line("    how, fresh, max = parse_guard(guard)");
        self.line("    if how == nil then return redis.error_reply(fresh) end");
        self.line("  end");
        self.line("  local rise, lerr = learn_terms(ARGV[a + 3])");
        self.line("  if lerr ~= nil then");
        self.line("    return redis.error_reply(lerr)");
        self.line("  end");
        self.line("  if guard ~= '' and epoch == nil then");
        self.line(
            "    return redis.error_reply('a call with a loss guard needs the epoch key last')",
        );
        self.line("  end");
        // A call that waited in a hung server's buffers until after its
        // caller gave up must not charge units nobody was told of.
        self.line("  if deadline ~= nil then");
        self.line("    local at = now");
        self.line("    if ARGV[2] ~= '' then at = clock_us('') end");
        self.line("    if at > deadline then");
        self.line("      return redis.error_reply('EXPIRED the caller gave up on this call at ' .. I(deadline))");
        self.line("    end");
        self.line("  end");
        // The epoch is read at the first need only (common.lua,
        // `guard_lost`): a seller whose places are written needs none.
        self.line("  local G = nil");
        self.line("  if guard ~= '' then");
        self.line("    G = new_guard(epoch, how, true, fresh, max)");
        self.line(format!(
            "    local serr = guard_seen(G, ARGV[a + 4] or '', KEYS[nreq * {0} + 2], KEYS[nreq * {0} + 3])",
            1 + k
        ));
        self.line("    if serr ~= nil then return redis.error_reply(serr) end");
        self.line("  end");
        self.line("  local out, hashes = { now }, {}");
        self.line("  for q = 1, nreq do");
        self.line(format!(
            "    shape_request(out, hashes, KEYS, ARGV, q, 4 + (q - 1) * {}, 1 + (q - 1) * {}, all[q], now, G, life, real, rise)",
            5 + 5 * k,
            1 + k
        ));
        self.line("  end");
        self.line("  flush(hashes, real)");
        self.line("  if G ~= nil then out[#out + 1] = G.found end");
        self.line("  return out");
        self.line("end");
    }
}

impl JobsAnswer {
    /// Reads a shape's reply ([`Shape::lua`]): the call's `now`, then
    /// [`ROW`] integers per request (status, units, remaining, retry-after
    /// µs, reset-after µs, go-at µs, by, jobs, next, tight), then the loss
    /// guard's flag when the call carried one. The millisecond figures of
    /// [`Reply`] are the µs ones rounded up, as the general reply has them.
    pub fn from_compact(
        raw: &[i64],
        requests: usize,
        guarded: bool,
    ) -> Result<JobsAnswer, MalformedReply> {
        let malformed = || MalformedReply(raw.to_vec());
        if raw.len() != 1 + ROW * requests + usize::from(guarded) || requests == 0 {
            return Err(malformed());
        }
        let now_us = raw[0];
        let epoch = match (guarded, raw.last()) {
            (false, _) => EpochFound::Kept,
            (true, Some(&flag)) => EpochFound::from_flag(flag).ok_or_else(malformed)?,
            (true, None) => return Err(malformed()),
        };
        let replies = raw[1..1 + ROW * requests]
            .chunks(ROW)
            .map(|c| {
                let (retry_us, reset_us) = (c[3], c[4]);
                if !(-1..=1).contains(&c[0])
                    || retry_us < 0
                    || reset_us < 0
                    || c[7] < 0
                    || !(0..=3).contains(&c[8])
                    || c[9] < 0
                {
                    return Err(malformed());
                }
                Ok(JobsReply {
                    head: Reply {
                        status: c[0],
                        granted: c[1],
                        remaining: c[2],
                        retry_after_ms: ceil_ms(retry_us),
                        reset_after_ms: ceil_ms(reset_us),
                        go_at_us: c[5],
                        retry_after_us: retry_us,
                        reset_after_us: reset_us,
                        now_us,
                        by: c[6],
                    },
                    jobs: c[7],
                    next: c[8],
                    tight: c[9],
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(JobsAnswer { replies, epoch })
    }
}

/// µs as ms, rounded up (never early).
fn ceil_ms(us: i64) -> i64 {
    (us + 999).div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::rule::Rule;
    use crate::limiter::script::{BlockAt, JobsRequest, SlotTerms, StateKey};
    use std::time::Duration;

    fn rule(a: Algorithm) -> Rule {
        Rule::new(a, 10, Duration::from_secs(1), None).expect("rule")
    }

    fn request(rules: Vec<(StateKey, Rule)>) -> JobsRequest {
        JobsRequest {
            call_id: "c".into(),
            block: BlockAt {
                key: "h".into(),
                read: BlockRead::Field,
            },
            rules,
            costs: vec![1],
            slots: None,
        }
    }

    fn call(requests: Vec<JobsRequest>) -> JobsCall {
        JobsCall {
            now_us: None,
            dry_run: false,
            requests,
            guard: None,
            learn: None,
        }
    }

    /// Which calls run a generated function: every case below changes one
    /// thing of the plain call, and each of those must run the general one.
    #[test]
    fn only_plain_charging_calls_of_one_shape_have_a_shape() {
        let gcra = rule(Algorithm::Gcra);
        let tb = rule(Algorithm::TokenBucket);
        let plain = request(vec![
            (StateKey::new("h", "r0"), gcra),
            (StateKey::new("h", "r1"), tb),
        ]);
        assert_eq!(
            Shape::of_call(&call(vec![plain.clone()])).map(|s| s.name()),
            Some("gcra_tb".to_owned())
        );
        let unlimited = request(Vec::new());
        assert_eq!(
            Shape::of_call(&call(vec![unlimited.clone(), unlimited.clone()])).map(|s| s.name()),
            Some("none".to_owned())
        );
        let dry = JobsCall {
            dry_run: true,
            ..call(vec![plain.clone()])
        };
        let global = request(vec![(StateKey::new("global", "r0"), gcra)]);
        let shadow = request(vec![(StateKey::new("h", "s0"), gcra)]);
        let unblocked = JobsRequest {
            block: BlockAt::new("h", BlockRead::Ignore),
            ..plain.clone()
        };
        let slots = JobsRequest {
            slots: Some(SlotTerms {
                key: "slots".into(),
                max: 1,
                lease_us: 1,
                poll_us: 1,
            }),
            ..plain.clone()
        };
        let many = request(vec![(StateKey::new("h", "r0"), gcra); MAX_RULES + 1]);
        for (what, c) in [
            ("a dry run", dry),
            ("a global rule", call(vec![global])),
            ("a shadow place", call(vec![shadow])),
            ("a block not read", call(vec![unblocked])),
            ("slots", call(vec![slots])),
            ("too many rules", call(vec![many])),
            ("two shapes", call(vec![plain.clone(), unlimited])),
            ("no request", call(Vec::new())),
        ] {
            assert_eq!(Shape::of_call(&c), None, "{what}");
        }
    }

    #[test]
    fn a_compact_reply_reads_as_the_general_one() {
        // now, then one granted row: 2 jobs, 3 units, retry 1001 µs.
        let raw = [100, 1, 3, 7, 1001, 2000, 150, 0, 2, 1, 1];
        let answer = JobsAnswer::from_compact(&raw, 1, false).expect("reads");
        let r = answer.replies[0];
        assert_eq!((r.head.status, r.head.granted, r.head.remaining), (1, 3, 7));
        assert_eq!((r.head.retry_after_ms, r.head.retry_after_us), (2, 1001));
        assert_eq!((r.head.reset_after_ms, r.head.go_at_us), (2, 150));
        assert_eq!((r.head.now_us, r.jobs, r.next, r.tight), (100, 2, 1, 1));
        let guarded = [&raw[..], &[1]].concat();
        assert_eq!(
            JobsAnswer::from_compact(&guarded, 1, true)
                .expect("reads")
                .epoch,
            EpochFound::Lost
        );
        for bad in [
            &raw[..10],
            &guarded[..],
            &[100, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0][..],
        ] {
            assert!(JobsAnswer::from_compact(bad, 1, false).is_err(), "{bad:?}");
        }
    }

    /// Writes the library of one shape (`SHAPE_LUA`: its name, e.g. `gcra`
    /// or `gcra_tb`) to the file `SHAPE_LUA_OUT`, for measuring it by hand
    /// (BENCHMARKS.md, issue 37's callgrind figures):
    /// `SHAPE_LUA=gcra SHAPE_LUA_OUT=/tmp/shape.lua cargo test --lib write_a_shape_library -- --ignored`
    #[test]
    #[ignore = "a tool: writes a file for a benchmark"]
    fn write_a_shape_library() {
        let name = std::env::var("SHAPE_LUA").unwrap_or_else(|_| "gcra".into());
        let out = std::env::var("SHAPE_LUA_OUT").expect("SHAPE_LUA_OUT names the file to write");
        let algorithms = name
            .split('_')
            .map(|a| {
                Algorithm::ALL
                    .into_iter()
                    .find(|x| short(*x) == a)
                    .unwrap_or_else(|| panic!("{a}: not an algorithm's short name"))
            })
            .collect();
        let lib = ShapeLibrary::new(&Shape::new(algorithms).expect("at most MAX_RULES rules"));
        std::fs::write(&out, &lib.code).expect("write the library");
        println!("{} ({}) written to {out}", lib.function, lib.name);
    }

    #[test]
    fn every_shape_names_its_function_apart() {
        let one = ShapeLibrary::new(&Shape::new(vec![Algorithm::Gcra]).expect("shape"));
        let two =
            ShapeLibrary::new(&Shape::new(vec![Algorithm::Gcra, Algorithm::Gcra]).expect("shape"));
        assert_ne!(one.function, two.function);
        assert!(one
            .code
            .contains(&format!("register_function('{}'", one.function)));
    }
}
