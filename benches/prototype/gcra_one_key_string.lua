-- A design prototype measured by benches/redis_cost.rs (not the limiter):
-- as gcra_one_key_hash.lua, with the seller's state as one string
-- "tat f blk" written with SET PX, so a decision makes the same commands
-- as the minimal GCRA script (TIME, GET, SET PX). KEYS[1] the seller's
-- key; ARGV limit, period_us, burst, cost.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -fdiv(-a, b) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, period, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local v = redis.call('GET', KEYS[1])
local u, f, blk = 0, 0, 0
if v then
  local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
  u, f, blk = tonumber(a), tonumber(b), tonumber(c)
end
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
local life = math.max(cdiv(debt, limit), blk - now)
redis.call('SET', KEYS[1], string.format('%d %d %d', now + whole, debt - whole * limit, blk), 'PX', math.max(0, cdiv(life, 1000)) + 1000)
local reset = cdiv(debt, limit)
return {1, cost, math.max(0, fdiv(cap - debt, period)), 0, cdiv(reset, 1000), now, 0, reset, now, 1}
