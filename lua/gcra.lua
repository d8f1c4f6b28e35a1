-- gcra: the generic cell rate algorithm, as in redis-cell's CL.THROTTLE.
-- Emission interval T = period/limit, tolerance = burst * T: a fresh key
-- admits `burst` at once, then one every T. (CL.THROTTLE's max_burst is our
-- burst - 1.) One timestamp per seller.
-- State: hash { tat = theoretical arrival time µs, f = remainder in 1/limit µs }.
ALGO.gcra = {
  cap = function(r)
    return r.burst
  end,
  load = function(h, r, now)
    local tat, f = fields(h, 'tat', 'f')
    return { debt = tat_debt(num(tat, 0), num(f, 0), r.limit, now) }
  end,
  avail = function(st, r, now)
    return math.max(0, fdiv(r.burst * r.period - st.debt, r.period))
  end,
  wait = function(st, r, now, need, taken)
    -- now must reach tat + need*T - tolerance.
    -- Summed in this order so no partial sum passes 2^53: debt + taken*T
    -- was admitted, so it is at most burst*T.
    return cdiv(st.debt + taken * r.period - (r.burst - need) * r.period, r.limit)
  end,
  left = function(st, r, now, n)
    return math.max(0, fdiv(r.burst * r.period - st.debt - n * r.period, r.period))
  end,
  reset = function(st, r, now, n)
    return cdiv(st.debt + n * r.period, r.limit)
  end,
  take = function(h, st, r, now, n, id)
    tat_store(h, st.debt + n * r.period, r.limit, now)
  end,
  refund = function(h, r, at, n, id, skip, taken)
    -- Other calls may have queued behind this one: only the part of its
    -- charge that cannot have drained yet comes back (drained_refund).
    local back = drained_refund(r, n, at, taken)
    local tat, f = fields(h, 'tat', 'f')
    local debt = tat_debt(num(tat, 0), num(f, 0), r.limit, at)
    if back > 0 and debt > 0 then
      tat_store(h, math.max(0, debt - back), r.limit, at)
    end
  end,
}

