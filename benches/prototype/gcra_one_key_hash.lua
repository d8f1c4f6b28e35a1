-- A design prototype measured by benches/redis_cost.rs (not the limiter):
-- gcra for one rule with everything the limiter keeps (the seller's 429
-- block, exact integer µs with the 1/limit remainder, the TTL, cost, the
-- limiter's 10-field reply), written straight-line with one key per seller:
-- a hash { tat, f, blk }, so the block is read with the state (TIME, HMGET,
-- HSET, PEXPIRE: one command fewer than the limiter's TIME, GET, HMGET,
-- HSET, PEXPIRE). KEYS[1] the seller's hash; ARGV limit, period_us, burst,
-- cost.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -fdiv(-a, b) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, period, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local h = redis.call('HMGET', KEYS[1], 'tat', 'f', 'blk')
local blk = tonumber(h[3] or '0')
local u, f = tonumber(h[1] or '0'), tonumber(h[2] or '0')
local debt = 0
if u >= now then debt = (u - now) * limit + f end
if blk > now then
  local reset = cdiv(debt, limit)
  return {0, 0, 0, cdiv(blk - now, 1000), cdiv(math.max(blk - now, reset), 1000), now, blk - now, math.max(blk - now, reset), now, 0}
end
local cap = burst * period
if debt + cost * period > cap then
  local wait = cdiv(debt + cost * period - cap, limit)
  return {0, 0, math.max(0, fdiv(cap - debt, period)), cdiv(wait, 1000), cdiv(cdiv(debt, limit), 1000), now, wait, cdiv(debt, limit), now, 1}
end
debt = debt + cost * period
local whole = fdiv(debt, limit)
redis.call('HSET', KEYS[1], 'tat', string.format('%d', now + whole), 'f', string.format('%d', debt - whole * limit))
local life = math.max(cdiv(debt, limit), blk - now)
redis.call('PEXPIRE', KEYS[1], math.max(0, cdiv(life, 1000)) + 1000)
local reset = cdiv(debt, limit)
return {1, cost, math.max(0, fdiv(cap - debt, period)), 0, cdiv(reset, 1000), now, 0, reset, now, 1}
