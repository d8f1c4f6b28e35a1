-- sliding_window_log: at most `limit` admissions in any window of `period`
-- ending now. State: sorted set, score = admission time in µs, one member
-- per admitted unit.
--
-- Members are `<call id>:<unit>`, unique per call. A log whose member is the
-- timestamp alone collapses two admissions in the same millisecond (or µs)
-- into one entry and then admits more than the limit. Refused calls are not
-- logged, so a refused client cannot push its own window forward.
ALGO.sliding_window_log = {
  cap = function(r)
    return r.limit
  end,
  load = function(key, r, now)
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
  take = function(key, st, r, now, n, id)
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
    expire_in(key, r.period)
  end,
  refund = function(key, r, at, n, id, skip, taken)
    -- Exact: the call's own members, whatever came since.
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

