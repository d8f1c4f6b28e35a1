-- burst_fill: `limit` tokens per period; the period starts at the first
-- request, and when it ends the bucket is refilled to exactly `limit` at once
-- (unused tokens never carry over). A refused request learns the time to the
-- next refill.
--
-- Because the refill is all at once, up to 2*limit - 1 requests can pass in
-- a span shorter than one period around a refill instant: the tail of one
-- period's tokens and the whole of the next. Use gcra or a sliding window
-- where that matters.
-- State: hash { s = period start µs, n = tokens left }.
ALGO.burst_fill = {
  cap = function(r)
    return r.limit
  end,
  load = function(h, r, now)
    local vs, vn = fields(h, 's', 'n')
    local s = num(vs, nil)
    if s == nil or now >= s + r.period then
      return { fresh = true, s = now, n = r.limit }
    end
    return { fresh = false, s = s, n = num(vn, 0) }
  end,
  avail = function(st, r, now)
    return math.max(0, st.n)
  end,
  wait = function(st, r, now, need, taken)
    -- need <= limit, and the next period starts full.
    return st.s + r.period - now
  end,
  left = function(st, r, now, n)
    return math.max(0, st.n - n)
  end,
  reset = function(st, r, now, n)
    if st.fresh and n == 0 then
      return 0
    end
    return st.s + r.period - now
  end,
  take = function(h, st, r, now, n, id)
    if st.fresh then
      put(h, 's', I(now), 'n', I(r.limit - n))
      expire_in(h, r.period)
    else
      incr(h, 'n', -n)
    end
  end,
  refund = function(h, r, at, n, id, skip, now)
    -- Tokens are additive: the period the take fell in gets them back.
    -- When every token of the period is back, nothing taken in it is held
    -- any more, so the period is as if never opened and the key goes: a
    -- period kept with all `limit` tokens would let its tail take `limit`
    -- and the refill `limit` more, 2*limit in under a period.
    local vs, vn = fields(h, 's', 'n')
    local s = num(vs, nil)
    if s ~= nil and s <= now and now < s + r.period then
      local left = math.min(r.limit, num(vn, 0) + n)
      if left >= r.limit then
        drop(h)
      else
        put(h, 'n', I(left))
      end
    end
  end,
}

