-- Minimal fixed window, the baseline of benches/redis_cost.rs: GET, INCR,
-- PEXPIRE on the window's first hit. KEYS[1] counter; ARGV limit, period_ms.
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c >= tonumber(ARGV[1]) then
  return 0
end
redis.call('INCR', KEYS[1])
if c == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
