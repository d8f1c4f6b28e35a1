-- leaky_bucket: a pacer. Admitted units leave one every period/limit; at
-- most `burst` units may be queued (scheduled and not yet gone). A unit that
-- fits is told the instant it may go and the caller waits until then, so the
-- downstream sees a smooth rate and never a burst. A unit that does not fit
-- is refused with the time until a queue slot frees.
-- State: hash { tat = µs the queue drains, f = remainder in 1/limit µs,
--               id = the call that queued last }.
--
-- A refund gives back slots only from the end of the queue: the call must
-- still be the last one queued. A slot in the middle cannot be handed out
-- again (the queue is one TAT, not a list of slots), and pulling the end
-- back would give the next caller a slot a later call already holds.
ALGO.leaky_bucket = {
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
  go = function(st, r, now)
    -- The first unit leaves when everything queued before it has left.
    return now + cdiv(st.debt, r.limit)
  end,
  take = function(h, st, r, now, n, id)
    tat_store(h, st.debt + n * r.period, r.limit, now)
    put(h, 'id', id)
  end,
  refund = function(h, r, at, n, id, skip, taken)
    -- A caller uses a grant's first slots, so the units given back are its
    -- last ones: the end of the queue, if nothing queued behind them.
    local tat, f, last = fields(h, 'tat', 'f', 'id')
    if last ~= id then
      return
    end
    local debt = tat_debt(num(tat, 0), num(f, 0), r.limit, at)
    if debt > 0 then
      tat_store(h, math.max(0, debt - n * r.period), r.limit, at)
    end
  end,
}

