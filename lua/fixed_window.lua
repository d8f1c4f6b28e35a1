-- fixed_window: at most `limit` per window; windows are aligned to the epoch
-- (a "1d" window is a UTC day). State: hash { w = window start µs, n = count }.
--
-- The expiry is set only when a window's state is created. The well-known
-- INCR + EXPIRE-on-every-hit script keeps pushing the expiry forward under
-- steady traffic, so the count never resets; here the window start is stored
-- and a hit in a new window starts a new count, whatever the TTL.
ALGO.fixed_window = {
  cap = function(r)
    return r.limit
  end,
  load = function(h, r, now)
    local start = fdiv(now, r.period) * r.period
    local w, count = fields(h, 'w', 'n')
    local fresh = num(w, -1) ~= start
    return { start = start, fresh = fresh, n = fresh and 0 or num(count, 0) }
  end,
  avail = function(st, r, now)
    return math.max(0, r.limit - st.n)
  end,
  wait = function(st, r, now, need, taken)
    -- need <= limit, and the next window starts empty.
    return st.start + r.period - now
  end,
  left = function(st, r, now, n)
    return math.max(0, r.limit - st.n - n)
  end,
  reset = function(st, r, now, n)
    if st.n + n > 0 then
      return st.start + r.period - now
    end
    return 0
  end,
  take = function(h, st, r, now, n, id)
    if st.fresh then
      put(h, 'w', I(st.start), 'n', I(n))
      expire_in(h, st.start + r.period - now)
    else
      incr(h, 'n', n)
    end
  end,
  refund = function(h, r, at, n, id, skip, now)
    -- Counts are additive: the window the take fell in gets them back,
    -- whatever was counted since.
    local start = fdiv(now, r.period) * r.period
    local w, count = fields(h, 'w', 'n')
    if num(w, -1) == start then
      put(h, 'n', I(math.max(0, num(count, 0) - n)))
    end
  end,
}

