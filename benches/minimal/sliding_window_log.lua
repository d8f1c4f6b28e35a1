-- Minimal sliding log, the baseline of benches/redis_cost.rs:
-- ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE. KEYS[1] log; ARGV now_us,
-- period_us, limit, member, period_ms.
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
