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
-- longer. The field is `;id,now,units` per record, in the order written
-- (the order of time, on Redis' clock); a write drops the records at its
-- front older than `life` (µs; the caller sends a few of its timeouts,
-- CALL_LIFE_US when it does not), appends its own, and then drops whole
-- records from the front until the field holds at most CALLS_BYTES (about
-- 50 records of production ids). So a write costs a few string operations,
-- never a parse of every record, however busy the seller. A cancel that
-- comes later than `life`, or after its record was pushed out by a seller's
-- many later calls, finds nothing and refunds nothing (the seller stays
-- charged, as before this existed).
--
-- Not covered: v1 (a key per rule, no seller hash to hold the records; the
-- legacy layout, see docs/limiter-state-v2.md) and requests whose block
-- token is '-' or '=' (the global rules' own call in cluster topology,
-- shadow rules). Their cancel answers 0 and writes nothing.
-- `src/limiter/model/mod.rs` (`cancel`, `CallRecord`) is the twin.

local CALLS_BYTES = 2048
local CALL_LIFE_US = 5000000

-- The seller's hash that holds a request's records, nil when not covered.
local function calls_hash(hashes, how, key)
  if how == 'f' or how == 'F' then
    return open_hash(hashes, key)
  end
  return nil
end

-- The live record of call `id` in `list` (the field's value, or nil): its
-- time, its units (0: a tombstone) and where it starts, or nil when there
-- is none (the first record of `id` is the one that counts).
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
  return at, tonumber(units), s
end

-- Appends the record of `units` (0: a tombstone) for call `id` at `now` to
-- `list`, the field `calls` of the hash `H` (nil when absent), trimmed as
-- the header says. The hash lives at least `life` more.
local function calls_write(H, list, now, life, id, units)
  local entry = ';' .. id .. ',' .. I(now) .. ',' .. I(units)
  if list ~= nil then
    local pos = 1
    while true do
      local at = string.match(list, '^;[^,;]*,(%d+),', pos)
      if at == nil or tonumber(at) + life > now then
        break
      end
      pos = string.find(list, ';', pos + 1, true) or (#list + 1)
    end
    entry = string.sub(list, pos) .. entry
    if #entry > CALLS_BYTES then
      local cut = string.find(entry, ';', #entry - CALLS_BYTES + 1, true)
      if cut ~= nil then
        entry = string.sub(entry, cut)
      end
    end
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
  local at, units, s = calls_find(list, id, now, life)
  if units == 0 then
    return 0
  end
  if s ~= nil then
    -- The record goes; its tombstone is appended.
    local e = string.find(list, ';', s + 1, true)
    list = string.sub(list, 1, s - 1) .. (e and string.sub(list, e) or '')
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
