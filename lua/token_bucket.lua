-- token_bucket: a bucket of `burst` tokens refilled continuously at
-- `limit` per `period`; a new bucket starts full.
-- State: hash { c = tokens * period_us (an exact integer), ts = µs of c }.
ALGO.token_bucket = {
  cap = function(r)
    return r.burst
  end,
  load = function(h, r, now)
    local full = r.burst * r.period
    local vc, ts = fields(h, 'c', 'ts')
    local c = num(vc, nil)
    if c == nil then
      return { c = full }
    end
    -- A bucket written under a larger rule (a limit learnt from 429s,
    -- learn.lua, reads the state as it is) holds at most this one's.
    c = math.min(c, full)
    local elapsed = math.max(0, now - num(ts, now))
    -- Compare before multiplying: a long idle time times the rate could
    -- leave the exact range.
    if elapsed >= cdiv(full - c, r.limit) then
      c = full
    else
      c = c + elapsed * r.limit
    end
    return { c = c }
  end,
  avail = function(st, r, now)
    return fdiv(st.c, r.period)
  end,
  wait = function(st, r, now, need, taken)
    -- Summed in this order so no partial sum passes 2^53: taken*T was
    -- admitted, so it is at most c <= burst*T.
    return cdiv(taken * r.period - (st.c - need * r.period), r.limit)
  end,
  left = function(st, r, now, n)
    return fdiv(st.c - n * r.period, r.period)
  end,
  reset = function(st, r, now, n)
    return cdiv(r.burst * r.period - (st.c - n * r.period), r.limit)
  end,
  take = function(h, st, r, now, n, id)
    local c = st.c - n * r.period
    put(h, 'c', I(c), 'ts', I(now))
    -- Once full again the state equals no state at all.
    expire_in(h, cdiv(r.burst * r.period - c, r.limit))
  end,
  refund = function(h, r, at, n, id, skip, taken)
    local ts = num(fields(h, 'ts'), nil)
    if ts ~= nil then
      -- Credit at the later of the refund's time and the last write, never
      -- moving `ts` back (which would refill the span between twice), and
      -- only the tokens that have not refilled since the take: the deficit
      -- drains like a gcra debt (drained_refund).
      at = math.max(at, ts)
      local back = drained_refund(r, n, at, taken)
      if back > 0 then
        local st = ALGO.token_bucket.load(h, r, at)
        local c = math.min(r.burst * r.period, st.c + back)
        put(h, 'c', I(c), 'ts', I(at))
        expire_in(h, cdiv(r.burst * r.period - c, r.limit))
      end
    end
  end,
}

