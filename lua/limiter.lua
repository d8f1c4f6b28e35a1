-- limiter.lua: the library's one entry point, `limiter_call(KEYS, ARGV)`,
-- which hands each operation to its driver:
--
-- ARGV[1]  'jobs', 'jobs_peek' and 'cancel': a list of job costs per
--          request (jobs.lua; every decision, a single one included, is
--          a jobs call); 'release' gives slots of max_in_flight back
--          (slots.lua); 'refund' gives back units of an earlier jobs
--          request, below; 'restore' writes back a replica's part of a
--          seller's state after a loss (restore.lua); 'install' writes
--          a new install's epoch, below.
--
-- A function of (KEYS, ARGV), so that the same text runs as an EVAL script
-- (`return limiter_call(KEYS, ARGV)`) and as a Redis Function registered
-- once per library load (see src/limiter/script.rs).
--
-- 'refund' (Redis Cluster: the global rules cut a prefix the seller's
-- rules granted, src/limiter/jobs.rs):
-- KEYS[1]     the request's first key (the seller's hash)
-- KEYS[1+i]   the hash of rule i's place
-- ARGV[2]     the refund's own time in µs, or '' for Redis' clock: at or
--             after every call that may have moved the rules since the take
-- ARGV[3]     units to give back (>= 1)
-- ARGV[4]     how many of the request's units to skip
-- ARGV[5]     the request's call id (names the units it took)
-- ARGV[6]     the request's block token (unread)
-- ARGV[7]     number of rules; then per rule: algorithm, limit, period_us,
--             burst, place
-- then        the now_us the jobs call replied with (the take's time)
-- Reply: the units given back asked for (only what is provably unused
-- moves: common.lua's refund contract).

local function refund_call(KEYS, ARGV, now, real)
  local units = tonumber(ARGV[3])
  if units == nil or units < 1 then
    return redis.error_reply('cost must be at least 1')
  end
  local nrules = tonumber(ARGV[7])
  local hashes = {}
  local rules, err = read_rules(KEYS, ARGV, 8, nrules, 2, hashes)
  if rules == nil then
    return redis.error_reply(err)
  end
  local skip = tonumber(ARGV[4])
  local taken = tonumber(ARGV[8 + nrules * 5])
  if taken == nil then
    return redis.error_reply('refund needs the time of the take')
  end
  local at = math.max(now, taken)
  for i = 1, nrules do
    refund_rule(rules[i], at, units, ARGV[5], skip, taken)
  end
  flush(hashes, real)
  return units
end

-- 'install' (a new install's first charging call, before it commits the
-- group's start positions: src/limiter/jobs.rs, `begin_install`):
-- KEYS[1]     the epoch key; KEYS[2], when restores are on, the server key
-- Writes the epoch as "never lost" (0) when it is missing, with the
-- server key (state_epoch). Once the group has committed, a replica that
-- finds the epoch missing then knows Redis lost it since: the epoch was
-- there before any replica could grant. Reply: 1 written, 0 already there.
local function install_call(KEYS)
  local _, found = state_epoch(KEYS[1], 0, true, true, KEYS[2])
  return found == 2 and 1 or 0
end

local function limiter_call(KEYS, ARGV)
  local op = ARGV[1]
  if op == 'release' then
    return slots_release(KEYS, ARGV)
  end
  local now = clock_us(ARGV[2])
  -- `now` on Redis' clock, or nil when the caller passed a time (flush).
  local real = ARGV[2] == '' and now or nil
  if op == 'jobs' or op == 'jobs_peek' or op == 'cancel' then
    return run_jobs(KEYS, ARGV, op, now, real)
  end
  if op == 'refund' then
    return refund_call(KEYS, ARGV, now, real)
  end
  if op == 'restore' then
    return restore_call(KEYS, ARGV, now, real)
  end
  if op == 'install' then
    return install_call(KEYS)
  end
  return redis.error_reply('unknown operation ' .. tostring(op))
end
