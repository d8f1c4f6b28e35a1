-- calls.lua: refund by call id (issue 21, part 5). A jobs call that ran but
-- whose reply never reached its caller (lost, or later than the caller's
-- timeout) charged units nobody was told of. The caller then sends
-- 'cancel' with the same requests (jobs.lua), which gives them back.
--
-- Each charged request records `;id,now,units` in the field `rec` of the
-- seller's hash (block token 'f'), which the call
-- reads (HGETALL) and writes (HSET) anyway: a record costs no command of
-- its own (issue 37; it was a ZADD to a sorted set of its own, a third of
-- the commands of a plain call). The field keeps the newest records, in
-- the order written, at most REC_BYTES in whole records (about five with
-- the worker's ids); a write drops those at the front older than `life`
-- first. A cancel finds its record there (the first of its id) and
-- refunds its units with each rule's own `refund`, taken at the recorded
-- `now` (so exactly what a `refund` op of the same call would give back).
-- When there is no record (the call has not run: it waits in a hung
-- server's buffers, or went out on a connection that was replaced), the
-- cancel leaves a tombstone, and the call, when it runs, charges nothing.
-- A refunded record is removed and becomes a tombstone too, so a second
-- cancel gives nothing back.
--
-- What the bound gives up: a cancel finds only the seller's last few
-- calls. A call whose reply was lost is the last its replica made for the
-- seller (the worker asks once per seller at a time, and the cancel goes
-- out at once); only when several other replicas charge the same seller
-- before the cancel runs can its record be gone, and then the seller
-- stays charged for it, as before records existed: never over a limit.
--
-- Tombstones are rare (one per cancel): they stay in the field `tomb`,
-- `;id,now` each, kept the same way within TOMB_BYTES. A record or
-- tombstone lives `life` (µs; the caller sends a few of its timeouts,
-- CALL_LIFE_US when it does not): older ones are ignored, and the hash is
-- kept at least that long (`calls_hold`).
--
-- Not covered: requests whose block token is '-' (the global rules' own
-- call in cluster topology, shadow rules). Their cancel answers 0 and
-- writes nothing.
-- `src/limiter/testkit/calls.rs` is the twin.

local REC_BYTES = 256
local TOMB_BYTES = 512
local CALL_LIFE_US = 5000000

-- Whether a request's calls are recorded (its block token), and so
-- whether it carries the key of its records.
local function calls_covered(how)
  return how == 'f'
end

-- The hash (and its held expiry) outlives what it holds for the records
-- by the records' life.
local function calls_hold(H, life)
  local ms = cdiv(life, 1000) + EXPIRY_SLACK_MS
  if ms > H.ttl then
    H.ttl = ms
  end
end

-- The first entry of `id` in `list` (a field `tomb` or `rec`, or nil)
-- when it is live: its time and, for a record, its units; nil otherwise.
local function list_find(list, id, now, life)
  if list == nil then
    return nil
  end
  local s = string.find(list, ';' .. id .. ',', 1, true)
  if s == nil then
    return nil
  end
  local at, units = string.match(list, '^;[^,;]*,(%d+),?(%d*)', s)
  at = tonumber(at)
  if at == nil or at + life <= now then
    return nil
  end
  return at, tonumber(units)
end

-- `list` (or nil) with `entry` appended: first the entries at the front
-- older than `life` go, then whole ones from the front until it holds at
-- most `bytes` (all are kept when the last alone is longer).
local function list_append(list, entry, now, life, bytes)
  if list == nil then
    return entry
  end
  local pos = 1
  while true do
    local at = string.match(list, '^;[^,;]*,(%d+)', pos)
    if at == nil or tonumber(at) + life > now then
      break
    end
    pos = string.find(list, ';', pos + 1, true) or (#list + 1)
  end
  if pos > 1 then
    list = string.sub(list, pos)
  end
  list = list .. entry
  if #list > bytes then
    local cut = string.find(list, ';', #list - bytes + 1, true)
    if cut ~= nil then
      list = string.sub(list, cut)
    end
  end
  return list
end

-- `list` without the first entry of `id` (which it holds).
local function list_remove(list, id)
  local s = string.find(list, ';' .. id .. ',', 1, true)
  local e = string.find(list, ';', s + 1, true) or (#list + 1)
  return string.sub(list, 1, s - 1) .. string.sub(list, e)
end

-- Whether the field `tomb` holds a live tombstone of call `id`.
local function tomb_find(list, id, now, life)
  return list_find(list, id, now, life) ~= nil
end

-- Appends call `id`'s tombstone at `now` to `list`, the field `tomb` of
-- the hash `H` (nil when absent).
local function tomb_write(H, list, now, life, id)
  hset(H, 'tomb', list_append(list, ';' .. id .. ',' .. I(now), now, life, TOMB_BYTES))
  calls_hold(H, life)
end

-- Records that call `id` charged `units` at `now`, in the field `rec` of
-- the seller's hash `H`.
local function calls_write(H, now, life, id, units)
  local entry = ';' .. id .. ',' .. I(now) .. ',' .. I(units)
  hset(H, 'rec', list_append(hget(H, 'rec'), entry, now, life, REC_BYTES))
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

-- One request of a 'cancel' call (`key`: the seller's hash); its reply:
-- the units given back, -1 when it left a tombstone (no record: the call
-- has not run, or ran and charged nothing), 0 when there is nothing to
-- do (cancelled already, or not covered).
local function cancel_request(hashes, how, key, id, rules, now, life)
  if not calls_covered(how) then
    return 0
  end
  local H = open_hash(hashes, key)
  local tombs = hget(H, 'tomb')
  if tomb_find(tombs, id, now, life) then
    return 0
  end
  local recs = hget(H, 'rec')
  local at, units = list_find(recs, id, now, life)
  if at ~= nil then
    hset(H, 'rec', list_remove(recs, id))
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
