-- slots.lua: a seller's calls in flight across the fleet (`max_in_flight`).
--
-- A seller with a cap has one sorted set of its own, `prefix:{seller}:slots`
-- (its hash tag, so it lives beside the seller's state on a cluster). Each
-- member is one granted job's lease, named `<call id>:<j>`, scored by the
-- µs instant (on the limiter's clock) it lapses: a replica that dies
-- holding slots leaks none for longer than its lease. The jobs script
-- (jobs.lua) counts the live leases and grants at most the free ones, in
-- the same call as the rate decision; the worker gives a slot back with
-- its call's answer ('release' below).
--
-- A request's slot terms (its ARGV after the rules): '' (no cap) or
-- 'max,lease_us,poll_us', and then one more KEY, the sorted set.

-- The terms of a request, or nil without a cap; an error text for a
-- malformed spec.
local function slots_terms(spec, key)
  if spec == nil or spec == '' then
    return nil
  end
  local max, lease, poll = string.match(spec, '^(%d+),(%d+),(%d+)$')
  max, lease, poll = tonumber(max), tonumber(lease), tonumber(poll)
  if max == nil or max < 1 or lease < 1 or poll < 1 or key == nil then
    return nil, 'slot terms must be max,lease_us,poll_us with each >= 1 and a key'
  end
  return { key = key, max = max, lease = lease, poll = poll }
end

-- Writes `n` leases `<prefix><j>` (j = 1..n) lapsing at `until_` (µs), and
-- keeps the set at least that long: it outlives its longest lease by a
-- second, then goes.
local function add_leases(s, prefix, n, until_, now)
  local args = {}
  local score = I(until_)
  for j = 1, n do
    args[#args + 1] = score
    args[#args + 1] = prefix .. j
  end
  redis.call('ZADD', s.key, unpack(args))
  local ttl = math.floor((until_ - now) / 1000) + 1000
  if redis.call('PTTL', s.key) < ttl then
    redis.call('PEXPIRE', s.key, ttl)
  end
end

-- Slots free now: the cap less the leases that have not lapsed. `G`: the
-- call's loss guard (common.lua), asked only when no lease is live; with
-- 'wait' it gives the instant Redis lost its data (`lost`). A set
-- that is gone within one lease of it may have held every slot, so they
-- count as taken until then: a charging call writes `max` leases
-- `lost:<j>` lapsing one lease after the loss (calls granted later count
-- beside them), a dry run only answers 0. The model is
-- `src/limiter/testkit/slots.rs`.
--
-- The server moved (server_moved, common.lua: a failover, a restart from
-- an older save): the set went back with every key, so the leases of
-- calls granted since that point are gone while the calls may still be
-- under way. Every slot then counts as taken until a lease after the
-- find: the first charging call to meet the set writes `max` leases
-- `mv<found>:<j>` lapsing then (calls granted later count beside them).
local function slots_free(s, now, G, charge)
  local moved = G ~= nil and charge and server_moved(G, now) or nil
  if moved ~= nil and moved.found > 0 and now < moved.found + s.lease then
    local first = 'mv' .. I(moved.found) .. ':'
    if not redis.call('ZSCORE', s.key, first .. 1) then
      add_leases(s, first, s.max, moved.found + s.lease, now)
    end
  end
  local live = redis.call('ZCOUNT', s.key, '(' .. I(now), '+inf')
  local lost = nil
  if live == 0 and G ~= nil then
    lost = guard_lost(G, now)
  end
  if lost ~= nil then
    local until_ = math.min(lost, now) + s.lease
    if now < until_ and redis.call('ZCOUNT', s.key, '-inf', '+inf') == 0 then
      if charge then
        add_leases(s, 'lost:', s.max, until_, now)
      end
      return 0
    end
  end
  return s.max - live
end

-- Takes a slot for each of `jobs` granted jobs of call `id`, each leased
-- until `until_` (µs), and drops the leases that lapsed.
local function slots_take(s, now, id, jobs, until_)
  redis.call('ZREMRANGEBYSCORE', s.key, '-inf', I(now))
  add_leases(s, id .. ':', jobs, until_, now)
end

-- Drops the leases call `id` may have taken for its `n` jobs (a cancel:
-- its answer never reached the worker, which holds none of them).
local function slots_forget(s, id, n)
  local members = {}
  for j = 1, n do
    members[j] = id .. ':' .. j
  end
  redis.call('ZREM', s.key, unpack(members))
end

-- 'release': KEYS[1] the sorted set, ARGV[2..] the leases given back.
-- Answers how many were still held.
local function slots_release(KEYS, ARGV)
  if #ARGV < 2 then
    return 0
  end
  local members = {}
  for i = 2, #ARGV do
    members[#members + 1] = ARGV[i]
  end
  return redis.call('ZREM', KEYS[1], unpack(members))
end
