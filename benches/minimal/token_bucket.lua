-- Minimal token bucket, the baseline of benches/redis_cost.rs: HMGET, HSET,
-- PEXPIRE. KEYS[1] bucket; ARGV now_us, capacity, refill_per_us, ttl_ms.
local now, cap, rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 't', 'n')
local tokens = cap
if h[1] then
  tokens = math.min(cap, tonumber(h[2]) + (now - tonumber(h[1])) * rate)
end
if tokens < 1 then
  return 0
end
redis.call('HSET', KEYS[1], 't', ARGV[1], 'n', tokens - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
