-- jobs.lua: grant the longest prefix of a list of jobs, each with its own
-- cost, all or nothing per job across every rule of a request, in one call.
-- limiter.lua hands the call here when ARGV[1] is 'jobs' or 'jobs_peek'.
--
-- A call is a list of requests; a request is one seller's keys and rules
-- with its list of job costs. Requests are decided in order, each seeing
-- what the ones before it wrote, so one call can carry several sellers.
--
-- ARGV[1]   'jobs' (decide and charge), 'jobs_peek' (decide, write nothing)
--           or 'cancel' (give back what the jobs call of the same requests
--           charged, or make it charge nothing: calls.lua)
-- ARGV[2]   now in µs, or '' for Redis' clock (TIME)
-- ARGV[3]   number of requests (>= 1); then per request:
--             call id (unique per call; names sliding-log members),
--             the job costs 'c1,c2,...' (each >= 1, at least one),
--             how its block is read ('f': the `block` field of the
--             seller's hash; '-': not at all, for the global rules' own
--             call in cluster topology),
--             number of rules, then per rule: algorithm, limit, period_us,
--             burst, place (see common.lua), then its slot
--             terms ('' without max_in_flight; see slots.lua)
--           then, optionally, a deadline in µs on Redis' clock (or ''):
--             a call that runs after it charges nothing and fails with
--             EXPIRED (its caller has timed out and will never read it)
--           then, optionally, how long (µs) the call's record lives
--             for a cancel (calls.lua; CALL_LIFE_US when absent or '')
--           then, optionally, the loss guard ('' or absent: none):
--             'wait' or 'admit', then '+new' on a new install and
--             '~<µs>' with a bound on the wait (parse_guard, common.lua),
--             with the epoch key last in KEYS. The
--             epoch is the instant this install's state was last found
--             lost (see state_epoch), read only when the call first meets
--             an unwritten place or an empty slot set (guard_lost,
--             common.lua); 'wait' charges every unwritten
--             place within reach of it a whole use at it, or holds it
--             unwritten until the bound (lost_fill, common.lua), 'admit'
--             only records and reports the loss
--           then, optionally, the learn terms ('' or absent: none): the
--             rise of a learnt factor in ppm per second (learn.lua);
--             requests whose block is the `block` field of the seller's
--             hash ('f') run on their learnt rules
--           then, optionally, the seen token ('' or absent: none; only
--             with a loss guard): '<tag> <entry>,...', an entry per
--             request, '<at µs>:<live until µs>' or '-': the replica's
--             last grant in the seller's hash, which a partial loss may
--             have taken back (rollback_hold, common.lua), with the
--             rollbacks key and the server key (server_moved,
--             common.lua) after the epoch key in KEYS
-- KEYS      per request: the seller's hash, then one key per rule (the
--           seller's hash, repeated, and the global rules' hash); then,
--           with slot terms, the seller's slots (slots.lua); then, with
--           a loss guard,
--           the epoch key (one per Redis Cluster slot: in the slot of
--           every other key of the call)
--
-- Reply: 13 integers per request, in order:
--   { status, units, remaining, retry_after_ms, reset_after_ms, go_at_us,
--     retry_after_us, reset_after_us, now_us, by, jobs, next, tight }
--   status 1: the first `jobs` jobs (`units` units) are granted and charged;
--          0: none, the first job must wait (by 0: a downstream block);
--         -1: none, the first job can never pass (cost above rule `by`'s cap).
--   next   what stops the prefix: 0 nothing (every job granted),
--          1 the next job must wait retry_after (by = the rule, 0 = block),
--          2 the next job can never pass (by = the rule),
--          3 the next job waits for a slot (max_in_flight; retry_after is
--            the terms' poll, by 0). On a refusal (status 0), 1 or 3.
--   A refused job ends the prefix: later, lighter jobs are not looked at.
--   remaining and reset_after are after the grant; go_at_us is when the
--   first granted unit may go (pacers; else now). tight: on a grant, the
--   rule whose `remaining` it is (the first of equals), 0 with no rules or
--   on a refusal.
--   A request cancelled before it ran (calls.lua) charges nothing and
--   answers status 0, by 0, next 1, every wait 0.
-- With a loss guard, one more integer ends the reply: 1 when this call
-- read the epoch, found it gone and wrote it (the state was lost), 2 when
-- it wrote it for a new install ('+new'), 3 when it found that a seller's
-- state went back behind this replica's own grants (a partial loss), else
-- 0. Exactly one charging call per loss answers 1 or 2: the first to meet
-- a place or slot set the loss emptied.
-- Reply of 'cancel': one integer per request (see cancel_request).

-- The index of the first rule whose capacity `cost` exceeds, else 0. A
-- learnt rule (learn.lua) is judged on its configured capacity, `cap0`.
local function never_rule(rules, cost)
  for i = 1, #rules do
    local r = rules[i]
    if cost > (r.cap0 or r.algo.cap(r)) then
      return i
    end
  end
  return 0
end

-- Appends one request's reply row (see the header) to `out`, the call's
-- flat reply: no table per request.
local function jobs_reply(out, now, status, units, remaining, retry, reset, go_at, by, jobs, next, tight)
  local o = #out
  out[o + 1], out[o + 2], out[o + 3] = status, units, remaining
  out[o + 4], out[o + 5], out[o + 6] = cdiv(retry, 1000), cdiv(reset, 1000), go_at
  out[o + 7], out[o + 8], out[o + 9] = retry, reset, now
  out[o + 10], out[o + 11], out[o + 12] = by, jobs, next
  out[o + 13] = tight or 0
end

-- µs until a job of `cost` fits after `taken` units are taken now, and
-- the rule that needs the longest (the first of equals).
local function jobs_wait_for(rules, states, avail, now, cost, taken)
  local wait, by = 0, 0
  for i = 1, #rules do
    local r = rules[i]
    if avail[i] - taken < cost then
      local w = r.algo.wait(states[i], r, now, cost, taken)
      if w > wait then
        wait, by = w, i
      end
    end
  end
  return wait, by
end

-- Units left and µs until fresh over every rule after `taken` units, and
-- the rule with the fewest left (the first of equals; 0 with no rules).
local function jobs_summary(rules, states, now, taken)
  local remaining, reset, tight = nil, 0, 0
  for i = 1, #rules do
    local r = rules[i]
    -- Never below 0: restored parts may leave a rule in debt (restore.lua
    -- charges each replica's part up to the capacity, and the parts
    -- together may pass it), and a reply's counts are never negative.
    local left = math.max(0, r.algo.left(states[i], r, now, taken))
    if remaining == nil or left < remaining then
      remaining, tight = left, i
    end
    reset = math.max(reset, r.algo.reset(states[i], r, now, taken))
  end
  return remaining or 0, reset, tight
end

-- Helpers are file-level functions rather than closures: with Functions
-- the file runs once per load, and a call then allocates no closures.
local function jobs_request(out, now, charge, id, until_, rules, costs, slots, G, held)
  local first_never = never_rule(rules, costs[1])
  if first_never > 0 then
    return jobs_reply(out, now, -1, 0, 0, 0, 0, now, first_never, 0, 2)
  end

  local states, avail = {}, {}
  local n = nil
  -- A bounded loss (lost_fill) or a rollback (`held`, rollback_hold)
  -- holds the list until `hold`, by rule `hby`.
  local hold, hby = 0, 0
  if held ~= nil then
    hold, hby = held, 1
  end
  for i = 1, #rules do
    local r = rules[i]
    local held
    states[i], held = load_rule(r, now, G)
    if held ~= nil and held > hold then
      hold, hby = held, i
    end
    avail[i] = r.algo.avail(states[i], r, now)
    if n == nil or avail[i] < n then
      n = avail[i]
    end
  end

  -- A downstream block, or a loss's hold, refuses the whole list; the wait
  -- is the longest of the block, the hold and the first job's own.
  if until_ > now or hold > now then
    local block = math.max(0, until_ - now)
    local wait, by = jobs_wait_for(rules, states, avail, now, costs[1], 0)
    local _, reset = jobs_summary(rules, states, now, 0)
    if hold - now > wait then
      wait, by = hold - now, hby
    end
    if block > 0 and block >= wait then
      wait, by = block, 0
    end
    return jobs_reply(out, now, 0, 0, 0, wait, math.max(block, hold - now, reset), now, by, 0, 1)
  end

  -- Every algorithm admits `taken + c` units exactly when it admits `c`
  -- more after `taken`, so the prefix is the longest whose sum fits the
  -- tightest rule. No rules (an unlimited seller): everything fits. With
  -- max_in_flight, a job that fits the rules also needs a free slot.
  local free = slots ~= nil and slots_free(slots, now, G, charge) or nil
  local jobs, units, stop, capped = 0, 0, 0, false
  for j = 1, #costs do
    local c = costs[j]
    stop = never_rule(rules, c)
    if stop > 0 or (n ~= nil and units + c > n) then
      break
    end
    if free ~= nil and j > free then
      capped = true
      break
    end
    jobs, units = j, units + c
  end

  if jobs == 0 then
    local remaining, reset = jobs_summary(rules, states, now, 0)
    if capped then
      return jobs_reply(out, now, 0, 0, remaining, slots.poll, reset, now, 0, 0, 3)
    end
    local wait, by = jobs_wait_for(rules, states, avail, now, costs[1], 0)
    return jobs_reply(out, now, 0, 0, remaining, wait, reset, now, by, 0, 1)
  end

  local go_at = now
  for i = 1, #rules do
    local r = rules[i]
    if r.algo.go ~= nil then
      go_at = math.max(go_at, r.algo.go(states[i], r, now))
    end
  end
  local remaining, reset, tight = jobs_summary(rules, states, now, units)
  local retry, by, next = 0, 0, 0
  if jobs < #costs then
    if stop > 0 then
      by, next = stop, 2
    elseif capped then
      retry, next = slots.poll, 3
    else
      retry, by = jobs_wait_for(rules, states, avail, now, costs[jobs + 1], units)
      next = 1
    end
  end
  if charge then
    for i = 1, #rules do
      local r = rules[i]
      take_rule(r, states[i], now, units, id)
    end
    if slots ~= nil then
      -- A pacer's later units go later: their leases run from their own
      -- go-at (conservatively, the grant's last unit's).
      local span = 0
      for i = 1, #rules do
        local r = rules[i]
        if r.algo.go ~= nil then
          span = math.max(span, cdiv(r.period, r.limit) * units)
        end
      end
      slots_take(slots, now, id, jobs, go_at + span + slots.lease)
    end
  end
  return jobs_reply(out, now, 1, units, remaining, retry, reset, go_at, by, jobs, next, tight)
end

-- Every request is read and checked before any is decided, so a bad
-- request refuses the whole call with nothing charged. (One MGET of every
-- block key instead of a GET each measured no gain, about 1 %, and would
-- add a command to the ACL operators have granted: see docs/src/deploy/redis.md.)
local function run_jobs(KEYS, ARGV, op, now, real)
  local charge = op == 'jobs'
  local nreq = tonumber(ARGV[3])
  if nreq == nil or nreq < 1 then
    return redis.error_reply('a jobs call needs at least one request')
  end
  local a, k = 4, 1
  local reqs = {}
  local hashes = {}
  for q = 1, nreq do
    local id = ARGV[a]
    local costs = {}
    local list = ARGV[a + 1] or ''
    if string.find(list, ',', 1, true) == nil then
      -- One job, the common case: no pattern matching.
      costs[1] = tonumber(list)
    else
      for c in string.gmatch(list, '[^,]+') do
        costs[#costs + 1] = tonumber(c) or 0
      end
    end
    for j = 1, #costs do
      if costs[j] == nil or costs[j] < 1 then
        return redis.error_reply('cost must be at least 1')
      end
    end
    if #costs == 0 then
      return redis.error_reply('a request needs at least one job')
    end
    local how = ARGV[a + 2]
    local nrules = tonumber(ARGV[a + 3])
    if how ~= 'f' and how ~= '-' then
      return redis.error_reply('unknown block token ' .. tostring(how))
    end
    local rules, err = read_rules(KEYS, ARGV, a + 4, nrules, k + 1, hashes)
    if rules == nil then
      return redis.error_reply(err)
    end
    local slots_key = k + 1 + nrules
    local slots, serr = slots_terms(ARGV[a + 4 + 5 * nrules], KEYS[slots_key])
    if serr ~= nil then
      return redis.error_reply(serr)
    end
    local next_k = slots_key + (slots ~= nil and 1 or 0)
    reqs[q] = { id = id, rules = rules, costs = costs, block_key = KEYS[k], how = how,
      slots = slots }
    a = a + 5 + 5 * nrules
    k = next_k
  end
  -- A call that waited in a hung server's buffers until after its caller
  -- gave up must not charge units nobody was told of.
  local deadline = tonumber(ARGV[a] or '')
  local life = tonumber(ARGV[a + 1] or '') or CALL_LIFE_US
  local guard = ARGV[a + 2] or ''
  local how, fresh, max = nil, false, nil
  if guard ~= '' then
    how, fresh, max = parse_guard(guard)
    if how == nil then
      return redis.error_reply(fresh)
    end
  end
  local rise, lerr = learn_terms(ARGV[a + 3])
  if lerr ~= nil then
    return redis.error_reply(lerr)
  end
  if guard ~= '' and KEYS[k] == nil then
    return redis.error_reply('a call with a loss guard needs the epoch key last')
  end
  local seen = ARGV[a + 4] or ''
  if op == 'cancel' then
    local out = {}
    for q = 1, nreq do
      local r = reqs[q]
      out[q] = cancel_request(hashes, r.how, r.block_key, r.id, r.rules, now, life)
      -- Its slots of max_in_flight too: the worker never held them.
      if r.slots ~= nil then
        slots_forget(r.slots, r.id, #r.costs)
      end
    end
    flush(hashes, real)
    return out
  end
  if deadline ~= nil then
    local real = now
    if ARGV[2] ~= '' then
      real = clock_us('')
    end
    if real > deadline then
      return redis.error_reply('EXPIRED the caller gave up on this call at ' .. I(deadline))
    end
  end
  local G = nil
  if guard ~= '' then
    G = new_guard(KEYS[k], how, charge, fresh, max)
    local serr = guard_seen(G, seen, KEYS[k + 1], KEYS[k + 2])
    if serr ~= nil then
      return redis.error_reply(serr)
    end
  end
  local out = {}
  for q = 1, nreq do
    local r = reqs[q]
    local until_ = blocked_until(hashes, r.block_key, r.how)
    local cancelled, H = false, nil
    if charge then
      cancelled, H = calls_before(hashes, r.how, r.block_key, r.id, now, life)
    end
    if cancelled then
      jobs_reply(out, now, 0, 0, 0, 0, 0, now, 0, 0, 1)
    else
      local rules = r.rules
      if rise ~= nil and r.how == 'f' and #rules > 0 then
        rules = learn_rules(rules, open_hash(hashes, r.block_key), now, rise, r.costs[1])
      end
      local held = nil
      if r.how == 'f' and #rules > 0 then
        held = rollback_hold(G, open_hash(hashes, r.block_key), q, now)
      end
      jobs_request(out, now, charge, r.id, until_, rules, r.costs, r.slots, G, held)
      -- This request's row: status, then units.
      local units = out[#out - 11]
      if H ~= nil and out[#out - 12] == 1 and units > 0 and #r.rules > 0 then
        calls_write(H, now, life, r.id, units)
        mark_grant(G, H, now, rules)
      end
    end
  end
  -- A conversion (settle) is written even for a refused request: the next
  -- call would convert the same state again, later.
  if charge then
    flush(hashes, real)
  end
  if G ~= nil then
    out[#out + 1] = G.found
  end
  return out
end
