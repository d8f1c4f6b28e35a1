-- Minimal GCRA, the baseline of benches/redis_cost.rs: TIME, GET, SET PX.
-- KEYS[1] theoretical arrival time (µs); ARGV interval_us, tolerance_us.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then
  tat = now
end
local new = tat + interval
if new - now > tolerance then
  return 0
end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1)
return 1
