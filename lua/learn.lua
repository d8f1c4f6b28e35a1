-- learn.lua: a seller's limit learnt from the downstream's 429s
-- (`limits.learn`). Not an algorithm: it scales the rules a request
-- carries before any algorithm reads them, so every algorithm, every
-- replica and both drivers (jobs.lua and the generated shapes) see the
-- same effective rule.
--
-- State: the field `learn` of the seller's hash,
--   'f:at:rules'  the factor f in ppm of the configured rules, set at µs
--                 `at` (the last drop, on Redis' clock), for the rules
--                 `rules` (their fingerprints, comma-separated).
-- The factor rises by `rise` ppm per second since `at` (additive
-- increase), up to the whole rule; block.lua lowers it on a 429
-- (multiplicative decrease). Rules other than `rules` (an edit, an
-- override starting or ending, a tier change) read it as absent: the
-- learning starts afresh for the rules now in force.
--
-- The effective rule never exceeds the configured one; it never falls
-- below one unit per period, nor below what the request's first job
-- costs (a job the configured rule admits is never refused for good).
-- A learnt gcra or token_bucket paces evenly (burst 1): a downstream that
-- answered 429 counts calls per window, and a bucket refilled during the
-- 429's hold would spend its burst into the next window at once, meet
-- another 429, and drop again (measured under the simulation: 0.80 of
-- the allowed rate with the burst scaled, 0.89 paced evenly).

local LEARN_FULL = 1000000

-- Buckets that let a burst out at once after an idle spell (a 429's block
-- is one): a learnt rule paces them evenly instead, burst 1.
local LEARN_SMOOTH = { gcra = true, token_bucket = true }

-- The fields of a `learn` value, or nil when absent or unreadable.
local function learn_parse(v)
  if v == nil or v == false then
    return nil
  end
  local f, at, rules = string.match(v, '^(%d+):(%d+):(.*)$')
  if f == nil then
    return nil
  end
  return tonumber(f), tonumber(at), rules
end

-- The factor (ppm) in force at `now` for the rules `digest`: the last
-- drop's, risen since at `rise` ppm per second; LEARN_FULL when nothing
-- was learnt for these rules.
local function learn_factor(v, now, rise, digest)
  local f, at, rules = learn_parse(v)
  if f == nil or rules ~= digest then
    return LEARN_FULL
  end
  local missing = LEARN_FULL - f
  if missing <= 0 then
    return LEARN_FULL
  end
  local dt = math.max(0, now - at)
  -- Compared before multiplying, so no product leaves the exact range.
  if dt >= cdiv(missing * 1000000, rise) then
    return LEARN_FULL
  end
  return f + fdiv(dt * rise, 1000000)
end

-- The fingerprints of a request's own rules, the ones learning scales
-- (those in the seller's hash `key`; not the global rules).
local function learn_digest(rules, key)
  local fps = {}
  for i = 1, #rules do
    local r = rules[i]
    if r.h.key == key and r.fp ~= nil then
      fps[#fps + 1] = r.fp
    end
  end
  return table.concat(fps, ',')
end

-- A rule scaled to `f` ppm: its limit and burst (so its rate and its
-- bucket) times f, at least 1 and at least what `first` (the request's
-- first job) needs, never above the configured values. `cap0` keeps the
-- configured capacity: what a job can never pass is judged on it.
local function learn_rule(r, f, first)
  local limit = math.max(1, fdiv(r.limit * f, LEARN_FULL))
  local burst = math.max(1, fdiv(r.burst * f, LEARN_FULL))
  if LEARN_SMOOTH[r.name] then
    burst = 1
  end
  local cap0 = r.algo.cap(r)
  local s = { algo = r.algo, h = r.h, period = r.period, name = r.name, cap0 = cap0,
    limit = limit, burst = burst }
  if r.algo.cap(s) < first and first <= cap0 then
    s.limit = math.min(r.limit, math.max(limit, cdiv(r.limit * first, cap0)))
    s.burst = math.min(r.burst, math.max(burst, cdiv(r.burst * first, cap0)))
  end
  -- The configured rule's fingerprint: its state is read under the learnt
  -- rule as it is, not converted (`settle`) at each step of the factor.
  -- Every algorithm's state means the same under a lower rule: a count
  -- per window, a log, a theoretical arrival time, tokens (clamped to the
  -- learnt bucket as they load). A conversion at each step would charge
  -- the units in use afresh, and move a pacer's next go-at.
  s.fp = r.fp
  return s
end

-- The rules of a request as learning leaves them at `now`: the same table
-- when nothing is learnt (the common case), else a new one whose rules in
-- the seller's hash `H` are scaled. `rise` is ppm per second.
local function learn_rules(rules, H, now, rise, first)
  local v = hget(H, 'learn')
  if v == nil then
    return rules
  end
  local f = learn_factor(v, now, rise, learn_digest(rules, H.key))
  if f >= LEARN_FULL then
    return rules
  end
  local out = {}
  for i = 1, #rules do
    local r = rules[i]
    if r.h.key == H.key and r.fp ~= nil then
      out[i] = learn_rule(r, f, first)
    else
      out[i] = r
    end
  end
  return out
end

-- The learn terms of a call ('' or absent: no learning): the rise in ppm
-- per second, or nil.
local function learn_terms(arg)
  if arg == nil or arg == '' then
    return nil
  end
  local rise = tonumber(arg)
  if rise == nil or rise < 1 then
    return nil, 'learn terms must be a rise of at least 1 ppm per second, got ' .. arg
  end
  return rise
end
