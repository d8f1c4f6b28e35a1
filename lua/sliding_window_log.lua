-- sliding_window_log: at most `limit` admissions in any window of `period`
-- ending now. One entry per admitted unit, with its admission time in µs.
--
-- v1 keeps the log as a sorted set of its own: score = admission time,
-- members `<call id>:<unit>`, unique per call. A log whose member is the
-- timestamp alone collapses two admissions in the same millisecond (or µs)
-- into one entry and then admits more than the limit.
--
-- v2 keeps it in the seller's hash, as one field `<place>:log`: the
-- admission times, sorted, 8 bytes each (struct '>d', exact below 2^53).
-- A second key would bring back what one key per seller removes (TRYAGAIN
-- while a slot migrates). Entries carry no call id: a refund removes
-- entries with the time of its take, which are interchangeable.
--
-- Refused calls are not logged, so a refused client cannot push its own
-- window forward.

local LOG_ENTRY = 8

local function log_at(log, i)
  return (struct.unpack('>d', log, (i - 1) * LOG_ENTRY + 1))
end

-- The index of the first entry above `t` in a sorted log of `n` entries
-- (n + 1 when none is).
local function log_above(log, n, t)
  local lo, hi = 1, n + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if log_at(log, mid) > t then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- The index of the first entry at or above `t`.
local function log_from(log, n, t)
  return log_above(log, n, t - 1)
end

ALGO.sliding_window_log = {
  cap = function(r)
    return r.limit
  end,
  load = function(h, r, now)
    if h.hash ~= nil then
      local log = fields(h, 'log') or ''
      local n = #log / LOG_ENTRY
      local first = log_above(log, n, now - r.period)
      local count = n - first + 1
      local newest = 0
      if count > 0 then
        newest = log_at(log, n)
      end
      return { log = log, first = first, count = count, newest = newest }
    end
    local key = h.key
    local lo = '(' .. I(now - r.period)
    local count = redis.call('ZCOUNT', key, lo, '+inf')
    local newest = 0
    if count > 0 then
      local top = redis.call('ZREVRANGEBYSCORE', key, '+inf', lo, 'WITHSCORES', 'LIMIT', 0, 1)
      newest = tonumber(top[2])
    end
    return { key = key, count = count, newest = newest, lo = lo }
  end,
  avail = function(st, r, now)
    return math.max(0, r.limit - st.count)
  end,
  wait = function(st, r, now, need, taken)
    -- The k-th oldest live entry must leave the window: it does at score + period.
    local k = st.count + taken + need - r.limit
    if k > st.count then
      -- One of the `taken` entries, written now.
      return r.period
    end
    if st.log ~= nil then
      return log_at(st.log, st.first + k - 1) + r.period - now
    end
    local e = redis.call('ZRANGEBYSCORE', st.key, st.lo, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    return tonumber(e[2]) + r.period - now
  end,
  left = function(st, r, now, n)
    return math.max(0, r.limit - st.count - n)
  end,
  reset = function(st, r, now, n)
    if n > 0 then
      return r.period
    end
    if st.count > 0 then
      return st.newest + r.period - now
    end
    return 0
  end,
  take = function(h, st, r, now, n, id)
    if h.hash ~= nil then
      -- The live entries (the dead ones go), then n entries at `now`, in order.
      local log = string.sub(st.log, (st.first - 1) * LOG_ENTRY + 1)
      local count = #log / LOG_ENTRY
      local at = log_above(log, count, now)
      local cut = (at - 1) * LOG_ENTRY
      log = string.sub(log, 1, cut) .. string.rep(struct.pack('>d', now), n)
        .. string.sub(log, cut + 1)
      put(h, 'log', log)
      expire_in(h, r.period)
      return
    end
    local key = h.key
    redis.call('ZREMRANGEBYSCORE', key, '-inf', I(now - r.period))
    local score = I(now)
    local j = 1
    -- ZADD in slices: Lua's unpack has a stack limit of a few thousand values.
    while j <= n do
      local args = {}
      local last = math.min(n, j + 499)
      for u = j, last do
        args[#args + 1] = score
        args[#args + 1] = id .. ':' .. u
      end
      redis.call('ZADD', key, unpack(args))
      j = last + 1
    end
    -- The newest entry, written now, leaves the window one period from now.
    expire_in(h, r.period)
  end,
  refund = function(h, r, at, n, id, skip, taken)
    if h.hash ~= nil then
      -- Up to n of the entries written at `taken`: the call's own, or ones
      -- exactly like them.
      local log = fields(h, 'log')
      if log then
        local count = #log / LOG_ENTRY
        local from = log_from(log, count, taken)
        local to = math.min(log_above(log, count, taken), from + n)
        if to > from then
          put(h, 'log', string.sub(log, 1, (from - 1) * LOG_ENTRY)
            .. string.sub(log, (to - 1) * LOG_ENTRY + 1))
        end
      end
      return
    end
    -- Exact: the call's own members, whatever came since.
    local key = h.key
    local j = skip + 1
    while j <= skip + n do
      local members = {}
      local last = math.min(skip + n, j + 499)
      for u = j, last do
        members[#members + 1] = id .. ':' .. u
      end
      redis.call('ZREM', key, unpack(members))
      j = last + 1
    end
  end,
}
