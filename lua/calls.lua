-- calls.lua: refund by call id (issue 21, part 5). A jobs call that ran but
-- whose reply never reached its caller (lost, or later than the caller's
-- timeout) charged units nobody was told of. The caller then sends
-- 'cancel' with the same requests (jobs.lua), which gives them back.
--
-- Each charged request records `id, now, units` in the field `calls` of the
-- seller's hash (v2 and v1+v2: block token 'f' or 'F', whose first key is
-- that hash). A cancel finds the record and refunds its units with each
-- rule's own `refund`, taken at the recorded `now` (so exactly what a
-- `refund` op of the same call would give back); when there is no record
-- yet (the call has not run: it waits in a hung server's buffers, or went
-- out on a connection that was replaced), the cancel leaves a tombstone
-- (units 0), and the call, when it runs, charges nothing. A refunded
-- record becomes a tombstone too, so a second cancel gives nothing back.
--
-- One field, not a field per call: every call reads the whole hash
-- (HGETALL), so a field per call would make every read of a busy seller
-- longer. The field is `;id,now,units` per record, oldest first; a write
-- keeps only the records younger than `life` (µs; the caller sends a few
-- of its timeouts, CALL_LIFE_US when it does not) and the newest
-- CALLS_MAX. A cancel that comes later than that, or for a seller charged
-- by more than CALLS_MAX calls within `life`, finds nothing and refunds
-- nothing (the seller stays charged, as before this existed).
--
-- Not covered: v1 (a key per rule, no seller hash to hold the records; the
-- legacy layout, see docs/limiter-state-v2.md) and requests whose block
-- token is '-' or '=' (the global rules' own call in cluster topology,
-- shadow rules). Their cancel answers 0 and writes nothing.
-- `src/limiter/model/mod.rs` (`cancel`, `CallRecord`) is the twin.

local CALLS_MAX = 64
local CALL_LIFE_US = 5000000

-- The seller's hash that holds a request's records, nil when not covered.
local function calls_hash(hashes, how, key)
  if how == 'f' or how == 'F' then
    return open_hash(hashes, key)
  end
  return nil
end

-- The live record of call `id` in `list` (the field's value, or nil):
-- its time and units (0: a tombstone), or nil when there is none.
local function calls_find(list, id, now, life)
  if list == nil then
    return nil
  end
  local s = string.find(list, ';' .. id .. ',', 1, true)
  if s == nil then
    return nil
  end
  local at, units = string.match(list, '^;[^,;]*,(%d+),(%d+)', s)
  at = tonumber(at)
  if at == nil or at + life <= now then
    return nil
  end
  return at, tonumber(units)
end

-- Records `units` (0: a tombstone) for call `id` at `now` in the hash `H`
-- whose field `calls` was `list`: the live records of other calls are
-- kept, the newest CALLS_MAX in all. The hash lives at least `life` more.
local function calls_write(H, list, now, life, id, units)
  local entry = ';' .. id .. ',' .. I(now) .. ',' .. I(units)
  if list ~= nil then
    local kept, n = {}, 0
    for e, eid, at in string.gmatch(list, '(;([^,;]*),(%d+),%d+)') do
      if eid ~= id and tonumber(at) + life > now then
        n = n + 1
        kept[n] = e
      end
    end
    n = n + 1
    kept[n] = entry
    entry = table.concat(kept, '', math.max(1, n - CALLS_MAX + 1), n)
  end
  hset(H, 'calls', entry)
  local ms = cdiv(life, 1000) + EXPIRY_SLACK_MS
  if ms > H.ttl then
    H.ttl = ms
  end
end

-- A jobs request before it is decided: whether a cancel came first (its
-- tombstone is there), and the hash and field its charge is recorded in.
local function calls_before(hashes, how, key, id, now, life)
  local H = calls_hash(hashes, how, key)
  if H == nil then
    return false, nil, nil
  end
  local list = hget(H, 'calls')
  local _, units = calls_find(list, id, now, life)
  return units == 0, H, list
end

-- One request of a 'cancel' call; its reply: the units given back, -1
-- when it left a tombstone (no record: the call has not run, or ran and
-- charged nothing), 0 when there is nothing to do (cancelled already, or
-- not covered).
local function cancel_request(hashes, how, key, id, rules, now, life)
  local H = calls_hash(hashes, how, key)
  if H == nil then
    return 0
  end
  local list = hget(H, 'calls')
  local at, units = calls_find(list, id, now, life)
  if units == 0 then
    return 0
  end
  calls_write(H, list, now, life, id, 0)
  if units == nil then
    return -1
  end
  local when = math.max(now, at)
  for i = 1, #rules do
    refund_rule(rules[i], when, units, id, 0, at)
  end
  return units
end
