-- calls.lua: refund by call id (issue 21, part 5). A jobs call that ran but
-- whose reply never reached its caller (lost, or later than the caller's
-- timeout) charged units nobody was told of. The caller then sends
-- 'cancel' with the same requests (jobs.lua), which gives them back.
--
-- Each charged request records `id, now, units` in a key of its own per
-- seller, `prefix:{seller}:calls` (v2 and v1+v2: block token 'f' or 'F';
-- the request's last KEY, in the seller's hash slot): a sorted set scored
-- by `now` (µs, Redis' clock unless the caller passed one), member
-- `id,units`. A jobs call only writes it (one ZADD); it never reads it,
-- so a busy seller's records cost nothing in the HGETALL of the seller's
-- hash that every call makes (BENCHMARKS.md 2e: the records in a field of
-- that hash cost a busy seller 65-75 % more Redis time per call). A
-- cancel finds the record (a ZRANGEBYSCORE of the live records, a scan
-- for its id) and refunds its units with each rule's own `refund`, taken
-- at the recorded `now` (so exactly what a `refund` op of the same call
-- would give back); when there is no record yet (the call has not run:
-- it waits in a hung server's buffers, or went out on a connection that
-- was replaced), the cancel leaves a tombstone, and the call, when it
-- runs, charges nothing. A refunded record becomes a tombstone too (the
-- record goes, ZREM), so a second cancel gives nothing back.
--
-- Tombstones are rare (one per cancel): they stay in the field `tomb` of
-- the seller's hash, `;id,now` each in the order written, which the jobs
-- call reads anyway; a write drops those at the front older than `life`,
-- then whole ones from the front until the field holds at most
-- TOMB_BYTES. A record or tombstone lives `life` (µs; the caller sends a
-- few of its timeouts, CALL_LIFE_US when it does not): older ones are
-- ignored.
--
-- Bounds without a command more on most calls: the hash's field `cn`
-- counts the records written since the last trim; every CALLS_TRIM-th
-- write trims the set to its newest CALLS_KEEP live records (a
-- ZREVRANGEBYSCORE for the cut, a ZREMRANGEBYSCORE: commands the README's
-- ACL grants already), so it never holds more than CALLS_KEEP +
-- CALLS_TRIM - 1 records. The set's expiry is handled as the hash's own
-- (common.lua, `lengthen`): the field `cexp` of the hash is the instant
-- (ms, Redis' clock) the set expires at, and a write sends PEXPIRE only
-- when that falls short of its record's life, then one grain longer. So a
-- busy seller pays about one ZADD per charged call, plus a short field in
-- the HSET the call sends anyway. A cancel that comes later than `life`,
-- or after its record was trimmed by a seller's many later calls, finds
-- nothing and refunds nothing (the seller stays charged, as before this
-- existed).
--
-- Not covered: v1 (no seller hash for the count and the tombstones; the
-- legacy layout, see docs/limiter-state-v2.md) and requests whose block
-- token is '-' or '=' (the global rules' own call in cluster topology,
-- shadow rules). Their cancel answers 0 and writes nothing.
-- `src/limiter/model/calls.rs` (`cancel`, `Records`) is the twin.

local CALLS_KEEP = 64
local CALLS_TRIM = 16
local TOMB_BYTES = 512
local CALL_LIFE_US = 5000000

-- Whether a request's calls are recorded (its block token), and so
-- whether it carries the key of its records.
local function calls_covered(how)
  return how == 'f' or how == 'F'
end

-- The hash (and its held expiry) outlives what it holds for the records
-- by the records' life.
local function calls_hold(H, life)
  local ms = cdiv(life, 1000) + EXPIRY_SLACK_MS
  if ms > H.ttl then
    H.ttl = ms
  end
end

-- Whether `list` (the field `tomb`, or nil) holds a live tombstone of call
-- `id` (the first of `id` is the one that counts).
local function tomb_find(list, id, now, life)
  if list == nil then
    return false
  end
  local s = string.find(list, ';' .. id .. ',', 1, true)
  if s == nil then
    return false
  end
  local at = tonumber(string.match(list, '^;[^,;]*,(%d+)', s))
  return at ~= nil and at + life > now
end

-- Appends call `id`'s tombstone at `now` to `list`, the field `tomb` of
-- the hash `H` (nil when absent), trimmed as the header says.
local function tomb_write(H, list, now, life, id)
  local entry = ';' .. id .. ',' .. I(now)
  if list ~= nil then
    local pos = 1
    while true do
      local at = string.match(list, '^;[^,;]*,(%d+)', pos)
      if at == nil or tonumber(at) + life > now then
        break
      end
      pos = string.find(list, ';', pos + 1, true) or (#list + 1)
    end
    entry = string.sub(list, pos) .. entry
    if #entry > TOMB_BYTES then
      local cut = string.find(entry, ';', #entry - TOMB_BYTES + 1, true)
      if cut ~= nil then
        entry = string.sub(entry, cut)
      end
    end
  end
  hset(H, 'tomb', entry)
  calls_hold(H, life)
end

-- The live record of call `id` in the sorted set `key`: its time, its
-- units and its member, or nil when there is none (the first of `id` in
-- the set's order is the one that counts).
local function calls_find(key, id, now, life)
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. I(now - life), '+inf', 'WITHSCORES')
  local p = id .. ','
  for i = 1, #live, 2 do
    local m = live[i]
    if string.sub(m, 1, #p) == p then
      return tonumber(live[i + 1]), tonumber(string.sub(m, #p + 1)), m
    end
  end
  return nil
end

-- Records that call `id` charged `units` at `now` in the sorted set `key`
-- of the seller whose hash is `H`, trimmed and expired as the header says.
-- `real`: the call's `now` when it is Redis' clock (nil otherwise).
local function calls_write(H, key, now, life, id, units, real)
  redis.call('ZADD', key, I(now), id .. ',' .. I(units))
  local n = num(hget(H, 'cn'), 0) + 1
  if n >= CALLS_TRIM then
    -- The cut: the newest dropped record's score, the (KEEP+1)-th live
    -- one from the top, or the stale ones' when fewer are live. The record
    -- just written is live, so the set never empties here.
    local cut = I(now - life)
    local kth = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. cut, 'WITHSCORES', 'LIMIT', CALLS_KEEP, 1)
    if #kth > 0 then
      cut = kth[2]
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cut)
    n = 0
  end
  hset(H, 'cn', I(n))
  local ms = cdiv(life, 1000) + EXPIRY_SLACK_MS
  local at = real_ms(real)
  local exp = num(hget(H, 'cexp'), 0)
  if exp < at + ms then
    local ttl = ms + EXPIRY_GRAIN_MS
    redis.call('PEXPIRE', key, ttl)
    -- Less one ms, as `lengthen` does.
    hset(H, 'cexp', I(at + ttl - 1))
  end
  calls_hold(H, life)
end

-- A jobs request before it is decided: whether a cancel came first (its
-- tombstone is there), and the seller's hash when its charge is recorded.
local function calls_before(hashes, how, key, id, now, life)
  if not calls_covered(how) then
    return false, nil
  end
  local H = open_hash(hashes, key)
  return tomb_find(hget(H, 'tomb'), id, now, life), H
end

-- One request of a 'cancel' call (`key`: the seller's hash, `ckey` its
-- records); its reply: the units given back, -1 when it left a tombstone
-- (no record: the call has not run, or ran and charged nothing), 0 when
-- there is nothing to do (cancelled already, or not covered).
local function cancel_request(hashes, how, key, ckey, id, rules, now, life)
  if not calls_covered(how) then
    return 0
  end
  local H = open_hash(hashes, key)
  local tombs = hget(H, 'tomb')
  if tomb_find(tombs, id, now, life) then
    return 0
  end
  local at, units, member = calls_find(ckey, id, now, life)
  if member ~= nil then
    redis.call('ZREM', ckey, member)
    -- The set may be empty now, so gone with its expiry: the next write
    -- sets one again.
    hset(H, 'cexp', '0')
  end
  tomb_write(H, tombs, now, life, id)
  if units == nil then
    return -1
  end
  local when = math.max(now, at)
  for i = 1, #rules do
    refund_rule(rules[i], when, units, id, 0, at)
  end
  return units
end
