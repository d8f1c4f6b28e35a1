-- sliding_window_log: at most `limit` admissions in any window of `period`
-- ending now. One entry per admitted unit, with its admission time in µs.
--
-- The log lives in the seller's hash, as one field `<place>:log`: the
-- admission times, sorted, 8 bytes each (struct '>d', exact below 2^53).
-- A key of its own would bring back what one key per seller removes
-- (TRYAGAIN while a slot migrates). Entries carry no call id: a refund
-- removes entries with the time of its take, which are interchangeable.
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
    local log = fields(h, 'log') or ''
    local n = #log / LOG_ENTRY
    local first = log_above(log, n, now - r.period)
    local count = n - first + 1
    local newest = 0
    if count > 0 then
      newest = log_at(log, n)
    end
    return { log = log, first = first, count = count, newest = newest }
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
    return log_at(st.log, st.first + k - 1) + r.period - now
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
    -- The live entries (the dead ones go), then n entries at `now`, in order.
    local log = string.sub(st.log, (st.first - 1) * LOG_ENTRY + 1)
    local count = #log / LOG_ENTRY
    local at = log_above(log, count, now)
    local cut = (at - 1) * LOG_ENTRY
    log = string.sub(log, 1, cut) .. string.rep(struct.pack('>d', now), n)
      .. string.sub(log, cut + 1)
    put(h, 'log', log)
    expire_in(h, r.period)
  end,
  refund = function(h, r, at, n, id, skip, taken)
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
  end,
}
