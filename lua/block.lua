-- block.lua: the downstream answered 429 for a seller; hold that seller for
-- every replica. limiter.lua refuses the seller while the block lasts.
-- A shorter block never shortens a longer one.
--
-- KEYS[1]  the seller's block key
-- ARGV[1]  now in µs, or '' for Redis' clock
-- ARGV[2]  block duration in µs (>= 1)
-- Reply: the µs instant the block ends.
local function block_call(KEYS, ARGV)
  local now = clock_us(ARGV[1])
  local dur = tonumber(ARGV[2])
  local until_ = now + dur
  local current = redis.call('GET', KEYS[1])
  if current and tonumber(current) >= until_ then
    return tonumber(current)
  end
  -- One second of slack, as every limiter key has: the value says when the
  -- block ends, so a key that outlives it is read as "not blocked".
  redis.call('SET', KEYS[1], string.format('%d', until_), 'PX', math.ceil(dur / 1000) + 1000)
  return until_
end
