-- limiter.lua: the decision for one seller, over all of its rules at once.
--
-- KEYS[1]     the seller's downstream block (set by block.lua on a 429): a
--             key of its own (v1) or the seller's hash (v2)
-- KEYS[1+i]   the state of rule i: its own key (v1) or a hash (v2)
-- ARGV[1]     op: 'acquire', 'peek' (dry run: decide, write nothing) or
--             'refund'; 'jobs', 'jobs_peek' and 'cancel' are a list of job
--             costs per request, with their own layout (see jobs.lua);
--             'release' gives slots of max_in_flight back (see slots.lua)
-- ARGV[2]     now in µs since the epoch, or '' to read Redis' clock (TIME);
--             explicit times exist only so tests can be deterministic.
--             For a refund, the refund's own time: at or after every call
--             that may have moved the rules since the take (Redis' clock in
--             production)
-- ARGV[3]     cost (units asked for, >= 1); for refund, units to give back
-- ARGV[4]     mode: 'all' (whole cost or nothing) or 'upto' (1..cost);
--             for refund, how many of the call's units to skip
-- ARGV[5]     call id, unique per call (names sliding-log members)
-- ARGV[6]     how the block is read: 'k' (GET KEYS[1], v1), 'f' (the `block`
--             field of the hash KEYS[1], v2) or '-' (not at all); 'F' and '='
--             in v1+v2, where KEYS[2] is the v1 block key (read with 'F') and
--             every rule has two keys, its place's hash then its v1 key
-- ARGV[7]     number of rules; then per rule: algorithm, limit, period_us,
--             burst, place ('' for v1; else the rule's place in its hash,
--             see common.lua)
-- refund only: after the rules, the now_us the acquire replied with
--             (windows and periods are those of the take being undone)
--
-- Reply: { status, granted, remaining, retry_after_ms, reset_after_ms,
--          go_at_us, retry_after_us, reset_after_us, now_us, by }
--   status 1 granted, 0 denied, -1 never (cost above a rule's capacity);
--   retry/reset in ms are rounded up, never early;
--   go_at_us is when the first granted unit may go (pacers; else now);
--   by is the refusing rule (1-based), 0 for a downstream block, or on a
--   grant the rule with the fewest units left.
--
-- All or nothing across rules: every rule is evaluated before any is
-- charged, so when one refuses no counter moves.
--
-- A function of (KEYS, ARGV), so that the same text runs as an EVAL script
-- (`return limiter_call(KEYS, ARGV)`) and as a Redis Function registered
-- once per library load (see src/limiter/script.rs).

local function reply(now, status, granted, remaining, retry_us, reset_us, go_at, by)
  return { status, granted, remaining, cdiv(retry_us, 1000), cdiv(reset_us, 1000),
    go_at, retry_us, reset_us, now, by }
end

-- Units left (the tightest rule's), µs until fresh, and the tightest rule,
-- after `taken` units.
local function summary(rules, states, now, taken)
  local remaining, reset, tight = nil, 0, 1
  for i = 1, #rules do
    local r = rules[i]
    local left = r.algo.left(states[i], r, now, taken)
    if remaining == nil or left < remaining then
      remaining, tight = left, i
    end
    reset = math.max(reset, r.algo.reset(states[i], r, now, taken))
  end
  return remaining or 0, reset, tight
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
  local cost = tonumber(ARGV[3])
  if cost == nil or cost < 1 then
    return redis.error_reply('cost must be at least 1')
  end
  local id = ARGV[5]
  local nrules = tonumber(ARGV[7])
  local hashes = {}
  local mixed = mixed_request(ARGV[6])
  local first_rule_key = mixed and 3 or 2
  local rules, err = read_rules(KEYS, ARGV, 8, nrules, first_rule_key, hashes, mixed)
  if rules == nil then
    return redis.error_reply(err)
  end

  if op == 'refund' then
    local skip = tonumber(ARGV[4])
    local taken = tonumber(ARGV[8 + nrules * 5])
    if taken == nil then
      return redis.error_reply('refund needs the time of the take')
    end
    local at = math.max(now, taken)
    for i = 1, nrules do
      refund_rule(rules[i], at, cost, id, skip, taken)
    end
    flush(hashes, real)
    return { 1, cost, 0, 0, 0, now, 0, 0, now, 0 }
  end


  local all = ARGV[4] == 'all'
  if all then
    for i = 1, nrules do
      if cost > rules[i].algo.cap(rules[i]) then
        return reply(now, -1, 0, 0, 0, 0, now, i)
      end
    end
  end

  local need = all and cost or 1
  local n = cost
  local wait, by = 0, 0
  local states = {}
  for i = 1, nrules do
    local r = rules[i]
    local st = load_rule(r, now)
    states[i] = st
    local av = r.algo.avail(st, r, now)
    if av < need then
      local w = r.algo.wait(st, r, now, need, 0)
      if w > wait then
        wait, by = w, i
      end
    end
    n = math.min(n, av)
  end

  -- A downstream block refuses the seller; the retry-after is the longer of
  -- the block and the rules' own wait, so that a caller retrying at the end
  -- of the block is not refused again by a rule.
  -- A conversion (settle) is written even when the call is refused: the
  -- next call would convert the same state again, later.
  local charge = op == 'acquire'
  local until_ = blocked_until(hashes, KEYS[1], ARGV[6], KEYS[2])
  if until_ > now then
    if charge then
      flush(hashes, real)
    end
    local block = until_ - now
    local _, reset = summary(rules, states, now, 0)
    if block >= wait then
      wait, by = block, 0
    end
    return reply(now, 0, 0, 0, wait, math.max(block, reset), now, by)
  end

  if wait > 0 then
    if charge then
      flush(hashes, real)
    end
    local remaining, reset = summary(rules, states, now, 0)
    return reply(now, 0, 0, remaining, wait, reset, now, by)
  end

  local go_at = now
  for i = 1, nrules do
    local r = rules[i]
    if r.algo.go ~= nil then
      go_at = math.max(go_at, r.algo.go(states[i], r, now))
    end
  end
  local remaining, reset, tight = summary(rules, states, now, n)
  if charge then
    for i = 1, nrules do
      local r = rules[i]
      take_rule(r, states[i], now, n, id)
    end
    flush(hashes, real)
  end
  return reply(now, 1, n, remaining, 0, reset, go_at, tight)
end
