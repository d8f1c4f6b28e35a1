-- common.lua: helpers shared by every algorithm. The limiter script is
-- assembled as common.lua, one file per algorithm, then limiter.lua.
--
-- All quantities are integers carried in Lua doubles. Rule validation keeps
-- every product (limit * period_us, burst * period_us) below 2^53, where
-- doubles are exact, and every division goes through fdiv/cdiv, which correct
-- the rounding of a / b. So the scripts and the Rust reference models compute
-- the very same integers.
--
-- Every algorithm is a table in ALGO with these functions (st = state read
-- by load, never written by anything but take/refund):
--   cap(r)                      the largest cost one call can ever be granted
--   load(key, r, now)           read the state as of `now` (no writes)
--   avail(st, r, now)           units admissible now
--   wait(st, r, now, need, taken)
--                               µs until `need` more units are admissible after
--                               `taken` are taken now (need <= cap; the state
--                               after the take refuses them)
--   left(st, r, now, n)         units still admissible after taking n
--   reset(st, r, now, n)        µs until the state is back to fresh after taking n
--   take(key, st, r, now, n, id) write the state for n >= 1 units, set the TTL
--   refund(key, r, at, n, id, skip, taken)
--                               give back n units of call `id`, taken at `taken`,
--                               skipping its first `skip`; `at` (>= taken) is the
--                               refund's own time, at or after every take since.
--                               Only what is provably unused may come back: after
--                               the refund the state must never admit more than
--                               if the call had taken only what it keeps.
--   go(st, r, now)              (pacers only) µs instant the next unit may leave
-- r = { limit, period, burst } with period in µs; `now` is µs since the epoch.

local ALGO = {}

-- Integer as a decimal string: redis.call would format large doubles with
-- an exponent, which would not read back exactly.
local function I(x)
  return string.format('%d', x)
end

-- floor(a / b), exact for |a|, |b| < 2^53.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b), exact for |a|, |b| < 2^53.
local function cdiv(a, b)
  return -fdiv(-a, b)
end

-- The call's time in µs since the epoch: `arg` when given (tests pass
-- explicit times), else Redis' clock, which every replica shares.
local function clock_us(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end

local function num(v, default)
  if v == false or v == nil then
    return default
  end
  return tonumber(v)
end

-- Expire `key` `us` microseconds from now, rounded up to Redis' millisecond
-- resolution, plus a fixed second of slack. The slack keeps a key from
-- expiring (on Redis' own clock) a moment before the script's time says its
-- state is stale, which would otherwise differ from the state a caller with
-- an explicit clock expects; every algorithm reads stale state correctly, so
-- the slack only costs an idle seller's bytes for one more second.
local EXPIRY_SLACK_MS = 1000
local function expire_in(key, us)
  redis.call('PEXPIRE', key, math.max(0, cdiv(us, 1000)) + EXPIRY_SLACK_MS)
end

-- The rules of a request: `nrules` groups of argv (algorithm, limit,
-- period_us, burst) from argv[a], with their keys from keys[k]. Returns nil
-- and a message for an algorithm no script implements.
local function read_rules(keys, argv, a, nrules, k)
  local rules = {}
  for i = 1, nrules do
    local b = a + (i - 1) * 4
    local algo = ALGO[argv[b]]
    if algo == nil then
      return nil, 'unknown algorithm ' .. tostring(argv[b])
    end
    rules[i] = {
      algo = algo,
      key = keys[k + i - 1],
      limit = tonumber(argv[b + 1]),
      period = tonumber(argv[b + 2]),
      burst = tonumber(argv[b + 3]),
    }
  end
  return rules
end

-- Debt of a TAT-based algorithm (gcra, leaky_bucket), in units of µs * limit:
-- how far the theoretical arrival time `u + f/limit` lies beyond `now`.
local function tat_debt(u, f, limit, now)
  if u < now then
    return 0
  end
  return (u - now) * limit + f
end

-- Store a TAT `now + debt/limit` exactly as whole µs `u` and remainder `f`.
local function tat_store(key, debt, limit, now)
  local whole = fdiv(debt, limit)
  redis.call('HSET', key, 'tat', I(now + whole), 'f', I(debt - whole * limit))
  expire_in(key, cdiv(debt, limit))
end

-- Debt (µs * limit) that a refund of n units taken at `taken` may give back
-- at `at` when other calls may have taken since: n * period less what has
-- drained since the take. Why this is safe: with x the queue end (TAT)
-- before the take, each later take maps x to max(x, t) + m*T, and their
-- composition is max(x + M, c) with c <= at + M (every take since happened at
-- or before `at`). With and without the refunded units, the queue ends then
-- differ by at least min(n*T, x + n*T - max(x, at)) >= n*T - (at - taken),
-- since x >= taken. token_bucket is the same with the deficit for the debt.
local function drained_refund(r, n, at, taken)
  return math.max(0, n * r.period - (at - taken) * r.limit)
end

