-- block.lua: the downstream answered 429 for a seller; hold that seller for
-- every replica. limiter.lua refuses the seller while the block lasts.
-- A shorter block never shortens a longer one.
--
-- KEYS[1]  the seller's block key (v1) or the seller's hash (v2)
-- ARGV[1]  now in µs, or '' for Redis' clock
-- ARGV[2]  block duration in µs (>= 1)
-- ARGV[3]  'k' (v1: a key of its own; also when absent), 'f' (v2: the
--          `block` field of the seller's hash) or 'F' (v1+v2: both, the
--          hash's field and the v1 key KEYS[2])
-- Reply: the µs instant the block ends.
local function block_call(KEYS, ARGV)
  local now = clock_us(ARGV[1])
  local dur = tonumber(ARGV[2])
  local until_ = now + dur
  -- One second of slack, as every limiter key has: the value says when the
  -- block ends, so a key that outlives it is read as "not blocked".
  local ms = math.ceil(dur / 1000) + 1000
  if ARGV[3] == 'F' then
    -- Each layout keeps the longer of its block and this one.
    local v2 = block_call({ KEYS[1] }, { ARGV[1] ~= '' and ARGV[1] or I(now), ARGV[2], 'f' })
    local v1 = block_call({ KEYS[2] }, { ARGV[1] ~= '' and ARGV[1] or I(now), ARGV[2], 'k' })
    return math.max(v1, v2)
  end
  if ARGV[3] == 'f' then
    local v = redis.call('HMGET', KEYS[1], 'block', 'exp')
    local current = v[1]
    if current and tonumber(current) >= until_ then
      return tonumber(current)
    end
    -- The hash holds the rules' state too: its expiry is only lengthened,
    -- and kept in its `exp` field (common.lua's `lengthen`).
    local exp, ttl = lengthen(KEYS[1], v[2], true, ms, real_ms(ARGV[1] == '' and now or nil))
    if exp ~= nil then
      redis.call('HSET', KEYS[1], 'block', I(until_), 'exp', exp)
      redis.call('PEXPIRE', KEYS[1], ttl)
    else
      redis.call('HSET', KEYS[1], 'block', I(until_))
    end
    return until_
  end
  local current = redis.call('GET', KEYS[1])
  if current and tonumber(current) >= until_ then
    return tonumber(current)
  end
  redis.call('SET', KEYS[1], string.format('%d', until_), 'PX', ms)
  return until_
end
