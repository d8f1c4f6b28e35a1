-- sliding_window_counter: the previous window's count, weighted by how much
-- of it still overlaps the sliding window, plus the current window's count.
-- Admits n when  prev * (period - elapsed) + (cur + n) * period <= limit * period,
-- all in exact integers. State: hash { w = current window start, cur, prev }.
-- Approximate by design (it assumes the previous window's hits were spread
-- evenly); two integers per seller whatever the limit.
ALGO.sliding_window_counter = {
  cap = function(r)
    return r.limit
  end,
  load = function(h, r, now)
    local start = fdiv(now, r.period) * r.period
    local vw, vcur, vprev = fields(h, 'w', 'cur', 'prev')
    local w = num(vw, -1)
    local cur, prev = 0, 0
    if w == start then
      cur, prev = num(vcur, 0), num(vprev, 0)
    elseif w == start - r.period then
      prev = num(vcur, 0)
    end
    return { start = start, w = w, cur = cur, prev = prev, e = now - start }
  end,
  avail = function(st, r, now)
    local room = fdiv(r.limit * r.period - st.prev * (r.period - st.e), r.period)
    return math.max(0, room - st.cur)
  end,
  wait = function(st, r, now, need, taken)
    local cur = st.cur + taken
    if cur + need <= r.limit then
      -- Within this window, once enough of the previous window has slid out.
      local e = r.period - fdiv((r.limit - cur - need) * r.period, st.prev)
      return e - st.e
    end
    -- In the next window, where this window's count is the weighted one.
    local e = r.period - fdiv((r.limit - need) * r.period, cur)
    return st.start + r.period + e - now
  end,
  left = function(st, r, now, n)
    local room = fdiv(r.limit * r.period - st.prev * (r.period - st.e), r.period)
    return math.max(0, room - st.cur - n)
  end,
  reset = function(st, r, now, n)
    if st.cur + n > 0 then
      return st.start + 2 * r.period - now
    elseif st.prev > 0 then
      return st.start + r.period - now
    end
    return 0
  end,
  take = function(h, st, r, now, n, id)
    if st.w == st.start then
      incr(h, 'cur', n)
    else
      put(h, 'w', I(st.start), 'cur', I(n), 'prev', I(st.prev))
      -- This window's count matters until the end of the next window.
      expire_in(h, st.start + 2 * r.period - now)
    end
  end,
  refund = function(h, r, at, n, id, skip, now)
    -- Counts are additive: the window the take fell in gets them back,
    -- whatever was counted since.
    local start = fdiv(now, r.period) * r.period
    local vw, vcur, vprev = fields(h, 'w', 'cur', 'prev')
    local w = num(vw, -1)
    if w == start then
      put(h, 'cur', I(math.max(0, num(vcur, 0) - n)))
    elseif w == start + r.period then
      put(h, 'prev', I(math.max(0, num(vprev, 0) - n)))
    end
  end,
}

