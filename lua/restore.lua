-- restore.lua: a replica writes back its own part of a seller's state
-- after Redis lost it (limiter.lua hands the call here when ARGV[1] is
-- 'restore'; src/limiter/restore.rs keeps the parts).
--
-- After a loss, a jobs call with a bounded wait (`~<µs>` in its guard,
-- redis.state_loss_wait) holds every rule it cannot fill with a whole use
-- within the bound, unwritten, until the loss plus the bound (lost_fill,
-- common.lua). Meanwhile each replica sends here, per seller, what it was
-- granted of each rule before the loss. Each part is charged as the rule
-- counts it, never less:
--   - sliding_window_log: the part's units at the part's time (its last
--     grant), so they leave the window when they would have;
--   - fixed_window: the units granted in the current window, at now;
--   - the rest (buckets, GCRA, the sliding counter): every unit granted
--     within the time a whole use takes to drain, at now, at most the
--     rule's capacity. Later than taken, so they drain later: the state
--     moves forward only, never below what the replicas' grants left.
-- A restored place keeps the hold (its `rh` field, read by lost_fill)
-- until the bound, so no grant reads it before the other replicas' parts
-- are in. A replica's part counts once per loss: the place remembers the
-- loss each replica restored for (`rs:<replica>`). A restore for another
-- loss than the one the epoch names now (an older one, or Redis lost its
-- data again) writes nothing.
--
-- A partial loss (rollback_hold, common.lua) is restored the same way,
-- with three differences: the loss is named by its find (the hash's `pf`
-- must still name it), every rule is restored (no place is empty, so
-- lost_fill covers none), and only what the replica was granted after its
-- own mark as the state holds it counts: that grant survived, every later
-- one of the replica's was lost (a replica that lost none finds its mark
-- at its last grant and adds nothing). The find's own hold (`ph`) covers
-- the hash.
-- Either way the restore sets the replica's mark (`w:<tag>`) to its last
-- grant, so its next call does not find the same loss again.
--
-- KEYS[i]     the hash of rule i's place; KEYS[n+1] the epoch key;
--             KEYS[n+2] the server key (server_moved, common.lua), which
--             names a find of every hash when the server moved
-- ARGV[2]     now in µs, or '' for Redis' clock
-- ARGV[3]     the replica's name (its worker id)
-- ARGV[4]     the loss this restores: '<µs>', the epoch as the replica
--             read it, or 'r<found µs>', a rollback found at `found`
-- ARGV[5]     the bound (µs): the hold ends at the loss plus it
-- ARGV[6]     n, the number of rules; then per rule: algorithm, limit,
--             period_us, burst, place (read_rules, common.lua)
-- then        per rule, its part: 'at:units,at:units,...' (at in µs on
--             Redis' clock, before the loss, oldest first; '' for none)
-- then        optionally the replica's tag and its last grant in this
--             hash (µs), for its mark
-- A rule whose whole use drains within the bound is left to lost_fill.
-- Reply: per rule, the units charged (0 for one left to lost_fill); -1
-- for every rule when the epoch (or the hash's find) is not the loss
-- named; -2 for a rule this replica already restored.

local function restore_part(r, now, lost, after, parts)
  local h = r.h
  local cap = r.algo.cap(r)
  local units = 0
  if r.algo == ALGO.sliding_window_log then
    for at, n in string.gmatch(parts, '(%d+):(%d+)') do
      at, n = tonumber(at), math.min(tonumber(n), cap)
      if at > now - r.period and at < lost and at > after then
        local st = r.algo.load(h, r, now)
        r.algo.take(h, st, r, at, n, 'restore')
        units = units + n
      end
    end
    return units
  end
  local from = now - r.period
  if r.algo == ALGO.fixed_window then
    from = fdiv(now, r.period) * r.period
  else
    -- How long a whole use takes to drain, read on an empty place.
    from = now - whole_use_reach(r, now)
  end
  for at, n in string.gmatch(parts, '(%d+):(%d+)') do
    at = tonumber(at)
    if at >= from and at < lost and at > after then
      units = units + tonumber(n)
    end
  end
  units = math.min(units, cap)
  if units > 0 then
    local st = r.algo.load(h, r, now)
    r.algo.take(h, st, r, now, units, 'restore')
  end
  return units
end

local function restore_call(KEYS, ARGV, now, real)
  local replica, loss, bound = ARGV[3], ARGV[4] or '', tonumber(ARGV[5])
  local nrules = tonumber(ARGV[6])
  local found = string.match(loss, '^r(%d+)$')
  local lost = tonumber(found or loss)
  if replica == nil or replica == '' or lost == nil or bound == nil or nrules == nil then
    return redis.error_reply('restore needs a replica, a loss, a bound and rules')
  end
  local rolled = found ~= nil
  local tag, last = ARGV[7 + nrules * 6], tonumber(ARGV[8 + nrules * 6] or '')
  if tag == '' then
    tag = nil
  end
  if rolled and tag == nil then
    return redis.error_reply('the restore of a rollback needs the replica tag')
  end
  local hashes = {}
  local rules, err = read_rules(KEYS, ARGV, 7, nrules, 1, hashes)
  if rules == nil then
    return redis.error_reply(err)
  end
  local out = {}
  local named
  if rolled then
    named = nrules > 0 and num(hget(rules[1].h.hash, 'pf'), -1) or -1
    -- The server moved (server_moved, common.lua): every seller hash is
    -- the find's, also one no call has touched since (or that the move
    -- took whole); it is held for the find from here.
    local srv = KEYS[nrules + 2]
    if named ~= lost and nrules > 0 and srv ~= nil then
      local _, found, held = read_server(srv)
      if found == lost and named < lost then
        hold_for(rules[1].h.hash, lost, held)
        named = lost
      end
    end
  else
    named = tonumber(redis.call('GET', KEYS[nrules + 1]) or '')
  end
  if named ~= lost then
    for i = 1, nrules do
      out[i] = -1
    end
    return out
  end
  local hold = lost + bound
  local mark = 'rs:' .. replica
  -- After a rollback: the replica's last grant that survived.
  local after = 0
  if rolled and nrules > 0 then
    after = num(hget(rules[1].h.hash, 'w:' .. tag), 0)
  end
  for i = 1, nrules do
    local r = rules[i]
    local h = r.h
    settle(r, now)
    -- A rule whose whole use drains within the bound: lost_fill charges
    -- it that use at the loss, which covers every part (a whole loss
    -- only: after a rollback the place is written, and lost_fill passes).
    if not rolled and whole_use_reach(r, lost) <= bound then
      out[i] = 0
    elseif num(hget(h.hash, h.p .. mark), -1) == lost then
      out[i] = -2
    else
      out[i] = restore_part(r, now, lost, after, ARGV[6 + nrules * 5 + i] or '')
      put(h, mark, I(lost))
      if not rolled and num(hget(h.hash, h.p .. 'rh'), 0) < hold then
        put(h, 'rh', I(hold))
      end
      stamp(r)
      -- The marks outlive the hold, so that a late repeat is still seen.
      expire_in(h, hold - now + r.period)
    end
  end
  -- The replica's grants are in: its mark says so (rollback_hold).
  if tag ~= nil and last ~= nil and nrules > 0 then
    local H = rules[1].h.hash
    if num(hget(H, 'w:' .. tag), 0) < last then
      hset(H, 'w:' .. tag, I(last))
    end
  end
  flush(hashes, real)
  return out
end
