-- block.lua: the downstream answered 429 for a seller; hold that seller for
-- every replica. limiter.lua refuses the seller while the block lasts.
-- A shorter block never shortens a longer one.
--
-- KEYS[1]  the seller's hash
-- ARGV[1]  now in µs, or '' for Redis' clock
-- ARGV[2]  block duration in µs (>= 1)
-- ARGV[3]  'f': the block is the `block` field of the seller's hash (the
--          token a jobs call reads it by)
-- ARGV[4]  optional: the learn
--          drop 'decrease:floor:rise:started:rules' (learn.lua): the
--          seller's learnt factor falls to `decrease` ppm of itself, never
--          below `floor` ppm, unless it already fell for this 429: the
--          call that met it was granted (`started`, µs on Redis' clock;
--          '' unknown, then within a second) at or before the last drop,
--          under the factor before it. `rules` are the seller's rules'
--          fingerprints.
-- Reply: the µs instant the block ends; with a learn drop,
--          { until, factor ppm after, 1 when this 429 lowered it else 0 }.

-- Lowers a seller's learnt factor in the hash fields read as `v` (its
-- `learn`); returns the factor after, whether it moved, and the field's
-- new value (nil when unchanged).
local function learn_drop(v, now, terms)
  local decrease, floor, rise, started, rules =
    string.match(terms, '^(%d+):(%d+):(%d+):(%d*):(.*)$')
  if decrease == nil then
    return nil
  end
  decrease, floor, rise, started = tonumber(decrease), tonumber(floor), tonumber(rise), tonumber(started)
  local f = learn_factor(v, now, rise, rules)
  local _, at, was = learn_parse(v)
  if at ~= nil and was == rules and f < LEARN_FULL then
    local same = (started ~= nil and started <= at) or (started == nil and now - at < 1000000)
    if same then
      return f, 0, nil
    end
  end
  f = math.max(floor, fdiv(f * decrease, LEARN_FULL))
  return f, 1, I(f) .. ':' .. I(now) .. ':' .. rules, cdiv((LEARN_FULL - f) * 1000000, rise)
end

local function block_call(KEYS, ARGV)
  local now = clock_us(ARGV[1])
  local dur = tonumber(ARGV[2])
  local until_ = now + dur
  -- One second of slack, as every limiter key has: the value says when the
  -- block ends, so a key that outlives it is read as "not blocked".
  local ms = math.ceil(dur / 1000) + 1000
  if ARGV[3] ~= 'f' then
    return redis.error_reply('a block is the field of the seller\'s hash (token f), not ' .. tostring(ARGV[3]))
  end
  do
    local v = redis.call('HMGET', KEYS[1], 'block', 'exp', 'learn')
    local current = tonumber(v[1] or '')
    local f, dropped, learnt, life = nil, nil, nil, nil
    if ARGV[4] ~= nil and ARGV[4] ~= '' then
      f, dropped, learnt, life = learn_drop(v[3], now, ARGV[4])
      if f == nil then
        return redis.error_reply('unreadable learn drop ' .. ARGV[4])
      end
    end
    local answer = function(u)
      if f == nil then
        return u
      end
      return { u, f, dropped }
    end
    if current and current >= until_ and learnt == nil then
      return answer(current)
    end
    until_ = math.max(until_, current or 0)
    local set = { 'block', I(until_) }
    if learnt ~= nil then
      set[3], set[4] = 'learn', learnt
      -- The factor is read until it has risen back whole.
      ms = math.max(ms, cdiv(life, 1000) + 1000)
    end
    -- The hash holds the rules' state too: its expiry is only lengthened,
    -- and kept in its `exp` field (common.lua's `lengthen`).
    local exp, ttl = lengthen(KEYS[1], v[2], true, ms, real_ms(ARGV[1] == '' and now or nil))
    if exp ~= nil then
      set[#set + 1] = 'exp'
      set[#set + 1] = exp
    end
    redis.call('HSET', KEYS[1], unpack(set))
    if ttl ~= nil then
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    return answer(until_)
  end
end
