-- common.lua: helpers shared by every algorithm. The limiter script is
-- assembled as common.lua, one file per algorithm, then limiter.lua.
--
-- All quantities are integers carried in Lua doubles. Rule validation keeps
-- every product (limit * period_us, burst * period_us) below 2^53, where
-- doubles are exact, and every division goes through fdiv/cdiv, which correct
-- the rounding of a / b. So the scripts and the Rust reference models compute
-- the very same integers.
--
-- Every algorithm is a table in ALGO with these functions (h = where the
-- state lives, see "Where one rule's state lives" below; st = the state read
-- by load, never written by anything but take/refund):
--   cap(r)                      the largest cost one call can ever be granted
--   load(h, r, now)             read the state as of `now` (no writes)
--   avail(st, r, now)           units admissible now
--   wait(st, r, now, need, taken)
--                               µs until `need` more units are admissible after
--                               `taken` are taken now (need <= cap; the state
--                               after the take refuses them)
--   left(st, r, now, n)         units still admissible after taking n
--   reset(st, r, now, n)        µs until the state is back to fresh after taking n
--   take(h, st, r, now, n, id)  write the state for n >= 1 units, set the TTL
--   refund(h, r, at, n, id, skip, taken)
--                               give back n units of call `id`, taken at `taken`,
--                               skipping its first `skip`; `at` (>= taken) is the
--                               refund's own time, at or after every take since.
--                               Only what is provably unused may come back: after
--                               the refund the state must never admit more than
--                               if the call had taken only what it keeps.
--   go(st, r, now)              (pacers only) µs instant the next unit may leave
-- r = { limit, period, burst } with period in µs; `now` is µs since the epoch.

local ALGO = {}

-- Integer as a decimal string: redis.call would format large doubles with
-- an exponent, which would not read back exactly.
local function I(x)
  return string.format('%d', x)
end

-- floor(a / b), exact for |a|, |b| < 2^53.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b), exact for |a|, |b| < 2^53.
local function cdiv(a, b)
  return -fdiv(-a, b)
end

-- The call's time in µs since the epoch: `arg` when given (tests pass
-- explicit times), else Redis' clock, which every replica shares.
local function clock_us(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end

local function num(v, default)
  if v == false or v == nil then
    return default
  end
  return tonumber(v)
end

-- Where one rule's state lives: a handle `h` that every algorithm reads
-- and writes through, never a key directly: h = { key = the seller's hash,
-- p = 'r0:', hash = H }, the fields of one place of one hash that holds the
-- seller's block and the state of every rule, by place (`r<i>:` enforced,
-- `s<i>:` shadow; global rules in a hash of their own). H is read once per
-- call (HGETALL) and written once at its end (`flush`), so a dry run
-- writes nothing and a call touches one key per seller (with
-- max_in_flight, two: slots.lua). `r<i>:fp` names the rule that wrote the
-- place; another rule there converts the state first (`settle`).
--
-- H has two forms. The common one (every call that drops no place): `raw`,
-- HGETALL's array as it came, and `w`, the writes as HSET's arguments in
-- order; a read looks in `w` (newest first), then in `raw`. No table is
-- built per field and the end of the call is one HSET of `w`: for a hash
-- of a few fields a scan is cheaper than a table. The other, built by
-- `widen` when a place is dropped (a conversion, a refund that empties
-- burst_fill) or when the hash has many fields: `t`, every field by name,
-- and `dirty`, the fields changed (set or deleted).
--
-- Values are Redis' strings in both: `num` reads them.

-- Expire a state `us` microseconds from now, rounded up to Redis' millisecond
-- resolution, plus a fixed second of slack. The slack keeps a key from
-- expiring (on Redis' own clock) a moment before the script's time says its
-- state is stale, which would otherwise differ from the state a caller with
-- an explicit clock expects; every algorithm reads stale state correctly, so
-- the slack only costs an idle seller's bytes for one more second.
-- A hash is shared: it keeps the longest expiry any of its places asks
-- for (`flush` never shortens it).
local EXPIRY_SLACK_MS = 1000
local function expire_in(h, us)
  local ms = math.max(0, cdiv(us, 1000)) + EXPIRY_SLACK_MS
  if ms > h.hash.ttl then
    h.hash.ttl = ms
  end
end

-- A hash keeps the instant it expires in its field `exp` (ms on Redis'
-- clock, at or before the key's real expiry), so a write learns without a
-- `PTTL` whether the expiry must move. When it must, it moves one more
-- grain than asked, so a busy seller's hash is lengthened about once a
-- grain rather than on every call (a TAT's expiry moves with every take):
-- the hash then lives at least the asked life + 1 s (the slack above) and
-- at most + 2 s. A hash without `exp` (written before the field existed)
-- is read with one `PTTL`.
local EXPIRY_GRAIN_MS = 1000

-- The `exp` to write and the TTL to set (ms) for a hash that must live
-- `ttl` ms more from `real_ms` (Redis' clock), or nil when its expiry
-- already reaches that far. `exp` is the hash's field as read (nil when
-- absent); `old` whether the hash existed before the call.
local function lengthen(key, exp, old, ttl, real_ms)
  exp = num(exp, nil)
  if exp == nil and old then
    local left = redis.call('PTTL', key)
    if left >= 0 then
      exp = real_ms + left - 1
    end
  end
  if exp ~= nil and exp >= real_ms + ttl then
    return nil
  end
  ttl = ttl + EXPIRY_GRAIN_MS
  -- Less one ms: the key's expiry is counted from the script's start,
  -- which may lie a ms before the TIME read here.
  return I(real_ms + ttl - 1), ttl
end

-- Redis' clock in ms: from the call's `now` when it came from TIME (`real`
-- is then that `now`), else read.
local function real_ms(real)
  return fdiv(real or clock_us(''), 1000)
end

-- A field of a hash as this call sees it (nil when absent).
local function hget(H, f)
  if H.t ~= nil then
    return H.t[f]
  end
  local w = H.w
  for i = #w - 1, 1, -2 do
    if w[i] == f then
      return w[i + 1]
    end
  end
  local raw = H.raw
  for i = 1, #raw, 2 do
    if raw[i] == f then
      return raw[i + 1]
    end
  end
  return nil
end

-- Sets a field of a hash.
local function hset(H, f, v)
  if H.t ~= nil then
    H.t[f] = v
    H.dirty[f] = true
    return
  end
  local w = H.w
  w[#w + 1] = f
  w[#w + 1] = v
end

-- Turns a hash into its table form (see above), its writes kept.
local function widen(H)
  if H.t ~= nil then
    return
  end
  local t, dirty, raw, w = {}, {}, H.raw, H.w
  for i = 1, #raw, 2 do
    t[raw[i]] = raw[i + 1]
  end
  for i = 1, #w, 2 do
    t[w[i]] = w[i + 1]
    dirty[w[i]] = true
  end
  H.t, H.dirty, H.raw, H.w = t, dirty, nil, nil
end

-- The values of up to three fields of a state, as HMGET answers them
-- (false when absent), as values, not a table.
local function fields(h, ...)
  local H, p = h.hash, h.p
  local n, a, b, c = select('#', ...), ...
  a = hget(H, p .. a) or false
  if n == 1 then
    return a
  end
  b = hget(H, p .. b) or false
  if n == 2 then
    return a, b
  end
  return a, b, hget(H, p .. c) or false
end

-- Sets up to three fields of a state: put(h, name, value, name, value, ...).
local function put(h, ...)
  local H, p = h.hash, h.p
  local a, x, b, y, c, z = ...
  hset(H, p .. a, x)
  if b ~= nil then
    hset(H, p .. b, y)
    if c ~= nil then
      hset(H, p .. c, z)
    end
  end
end

-- Adds n to an integer field.
local function incr(h, name, n)
  local f = h.p .. name
  hset(h.hash, f, I(num(hget(h.hash, f), 0) + n))
end

-- Forgets a state: every field of its place.
local function drop(h)
  local H, p = h.hash, h.p
  widen(H)
  for f in pairs(H.t) do
    if string.sub(f, 1, #p) == p then
      H.t[f] = nil
      H.dirty[f] = true
    end
  end
end

-- Past this many fields a hash is read as a table from the start: a
-- scan per field would cost more than building it.
local SCAN_FIELDS = 12

-- A hash as one call sees it; `hashes` caches them per call, so every
-- request of a call sees what the ones before it decided.
local function open_hash(hashes, key)
  local H = hashes[key]
  if H == nil then
    local raw = redis.call('HGETALL', key)
    H = { key = key, raw = raw, w = {}, ttl = 0, old = #raw > 0 }
    if #raw > 2 * SCAN_FIELDS then
      widen(H)
    end
    hashes[key] = H
    hashes[#hashes + 1] = H
  end
  return H
end

-- Writes what a call changed in its hashes: the set fields, the dropped
-- ones, and the expiry, lengthened only (see `lengthen`). `real` is the
-- call's `now` when it is Redis' clock (nil when the caller passed a time).
local function flush(hashes, real)
  for i = 1, #hashes do
    local H = hashes[i]
    local set, del = H.w, nil
    if set == nil then
      set, del = {}, {}
      for f in pairs(H.dirty) do
        local v = H.t[f]
        if v == nil then
          del[#del + 1] = f
        else
          set[#set + 1] = f
          set[#set + 1] = v
        end
      end
    end
    local ttl = nil
    if H.ttl > 0 and #set > 0 then
      local exp
      exp, ttl = lengthen(H.key, hget(H, 'exp'), H.old, H.ttl, real_ms(real))
      if exp ~= nil then
        set[#set + 1] = 'exp'
        set[#set + 1] = exp
      end
    end
    if #set > 0 then
      redis.call('HSET', H.key, unpack(set))
    end
    if del ~= nil and #del > 0 then
      redis.call('HDEL', H.key, unpack(del))
    end
    if ttl ~= nil then
      redis.call('PEXPIRE', H.key, ttl)
    end
  end
end

-- A seller's 429 block: the µs instant it ends, 0 when none. `how` is 'f'
-- (the `block` field of the seller's hash) or '-' (none: shadow rules,
-- the global rules' own call).
local function blocked_until(hashes, key, how)
  if how == 'f' then
    return num(hget(open_hash(hashes, key), 'block'), 0)
  end
  return 0
end

-- The rules of a request: `nrules` groups of argv (algorithm, limit,
-- period_us, burst, place) from argv[a], with their keys from keys[k]:
-- each rule's place in the hash at its key. Returns nil and a message for
-- an algorithm no script implements, or a rule without a place.
local function read_rules(keys, argv, a, nrules, k, hashes)
  local rules = {}
  for i = 1, nrules do
    local b = a + (i - 1) * 5
    local name = argv[b]
    local algo = ALGO[name]
    if algo == nil then
      return nil, 'unknown algorithm ' .. tostring(name)
    end
    local place = argv[b + 4]
    if place == nil or place == '' then
      return nil, 'rule ' .. i .. ' has no place'
    end
    rules[i] = {
      algo = algo,
      name = name,
      h = { key = keys[k + i - 1], p = place .. ':', hash = open_hash(hashes, keys[k + i - 1]) },
      limit = tonumber(argv[b + 1]),
      period = tonumber(argv[b + 2]),
      burst = tonumber(argv[b + 3]),
      fp = name .. ':' .. argv[b + 1] .. ':' .. argv[b + 2] .. ':' .. argv[b + 3],
    }
  end
  return rules
end

-- A rule back from its fingerprint ('name:limit:period:burst'), nil when
-- it does not parse or names an algorithm this code does not have.
local function parse_rule(fp)
  local name, limit, period, burst = string.match(fp, '^([%w_]+):(%d+):(%d+):(%d+)$')
  if name == nil or ALGO[name] == nil then
    return nil
  end
  return { algo = ALGO[name], limit = tonumber(limit), period = tonumber(period),
    burst = tonumber(burst), fp = fp }
end

-- Makes the state at a rule's place the rule's own, before the rule
-- reads it. The place's `fp` names the rule that wrote it. When another
-- rule is there now (a limit edit, an override starting or ending, a tier
-- change, a new algorithm), what the old rule admitted still counts:
--   - the same window algorithm and period (fixed_window,
--     sliding_window_log): the state is kept; a count per aligned window
--     and a log of admission times mean the same under any limit;
--   - anything else: the old rule's units in use now (its capacity less
--     what it would admit) are charged to a fresh state of the new rule,
--     at most its capacity. Charged at the edit, not when admitted, so they
--     drain later than they would have: conservative, never over.
-- An old rule that does not parse (written by a newer version) leaves
-- nothing. `src/limiter/local/convert.rs` is the specification.
-- Returns nothing; the place's `fp` is written with the state (`stamp`).
local function settle(r, now)
  local h = r.h
  local fp = hget(h.hash, h.p .. 'fp')
  if fp == nil or fp == r.fp then
    return
  end
  local old = parse_rule(fp)
  if old ~= nil and old.algo == r.algo and old.period == r.period
      and (r.algo == ALGO.fixed_window or r.algo == ALGO.sliding_window_log) then
    put(h, 'fp', r.fp)
    return
  end
  local used = 0
  if old ~= nil then
    local st = old.algo.load(h, old, now)
    used = math.max(0, old.algo.cap(old) - old.algo.avail(st, old, now))
  end
  drop(h)
  local charge = math.min(used, r.algo.cap(r))
  if charge > 0 then
    local st = r.algo.load(h, r, now)
    r.algo.take(h, st, r, now, charge, 'edit')
    put(h, 'fp', r.fp)
  end
end

-- Names the rule that wrote a place, after a take.
local function stamp(r)
  local h = r.h
  if hget(h.hash, h.p .. 'fp') ~= r.fp then
    put(h, 'fp', r.fp)
  end
end

-- Whether a refund may touch a rule's place: only the rule that took the
-- units is still there (after an edit, the units were converted).
local function owns(r)
  return hget(r.h.hash, r.h.p .. 'fp') == r.fp
end

-- The server key (server_moved, below): the run id the limiter last ran
-- on, its last find and that find's hold (µs; 0 0: none), or nil when the
-- key is missing or does not parse.
local function read_server(key)
  local run, found, hold = string.match(redis.call('GET', key) or '', '^(%S+) (%d+) (%d+)$')
  if run == nil then
    return nil
  end
  return run, tonumber(found), tonumber(hold)
end

-- The run id of the Redis process this script runs on (`INFO server`):
-- a promoted replica has its own, and a restart draws a new one.
local function server_run()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '-'
end

-- The instant (µs) the limiter's state was last lost, and whether this
-- call is the one that found it lost (1), or found this install new (2).
-- The epoch key never expires, so only a loss of Redis' data removes it;
-- a charging call then writes it with its own time, which is at or after
-- the loss. A new install (`fresh`: the worker's consumer group has never
-- committed an offset, so there was no state to lose) writes 0 instead:
-- nothing was lost, and no seller waits. A dry run reads a missing epoch
-- as a loss now (or, fresh, as none) and writes nothing. `srv`, the
-- server key when the call carries one (server_moved), is written with
-- the epoch when missing: the two are then always written together, so
-- a server key missing beside an epoch means a move.
local function state_epoch(key, now, charge, fresh, srv)
  local v = redis.call('GET', key)
  if v then
    return tonumber(v), 0
  end
  local at = fresh and 0 or now
  if not charge then
    return at, 0
  end
  redis.call('SET', key, I(at))
  if srv ~= nil then
    redis.call('SET', srv, server_run() .. ' 0 0', 'NX')
  end
  return at, fresh and 2 or 1
end

-- Reads a call's loss guard token (jobs.lua, ARGV): 'wait' or 'admit',
-- then optionally '+new' (a new install: a missing epoch is not a loss)
-- and '~<µs>' (the longest a 'wait' holds a seller that no fill can
-- cover: redis.state_loss_wait). Returns how, fresh, max, or nil and an
-- error.
local function parse_guard(token)
  local how, rest = string.match(token, '^(%a+)(.*)$')
  if how ~= 'wait' and how ~= 'admit' then
    return nil, 'unknown loss guard ' .. token
  end
  local fresh, max = false, nil
  if string.sub(rest, 1, 4) == '+new' then
    fresh, rest = true, string.sub(rest, 5)
  end
  if rest ~= '' then
    max = tonumber(string.match(rest, '^~(%d+)$') or '')
    if max == nil or max < 1 then
      return nil, 'unknown loss guard ' .. token
    end
  end
  return how, fresh, max
end

-- The loss guard of a call (jobs.lua), or nil: `key` the epoch key,
-- `how` whether a loss holds unwritten places ('wait') or is only
-- reported ('admit'), `charge` whether the call may write the epoch,
-- `fresh` whether this install is new, `max` the longest hold (µs; nil:
-- a whole use). The epoch is read at the first need only (a place no
-- rule has written, an empty slot set), not on every call: a seller
-- whose places are all written needs nothing of it (issue 37). `found`
-- is 1 once this call found the epoch gone and wrote it, 2 when it wrote
-- it for a new install, 3 when it found a rollback (rollback_hold).
local function new_guard(key, how, charge, fresh, max)
  return { key = key, wait = how == 'wait', charge = charge, fresh = fresh, max = max, found = 0 }
end

-- The instant the state was lost, when the guard holds places ('wait');
-- nil for 'admit'. Reads (and, charging, writes) the epoch once per call.
local function guard_lost(G, now)
  if G.at == nil then
    G.at, G.found = state_epoch(G.key, now, G.charge, G.fresh, G.srv)
  end
  if G.wait then
    return G.at
  end
  return nil
end

-- State lost (the epoch of jobs.lua is gone: Redis restarted empty, or
-- failed over to a replica that missed writes): a place that no rule has
-- written (no `fp`), read while a whole use at the loss instant `lost`
-- would still count, is charged that whole use at `lost`. That is the most
-- the lost state can have held: every unit it counted was taken at or
-- before the loss. So no seller passes its limit across a loss; a seller
-- first seen after it waits up to one period (a bucket: until a full one
-- would have drained). Past that reach the charge would be spent anyway,
-- so nothing is written.
--
-- With a bound (G.max, redis.state_loss_wait) a use that would count
-- longer than the bound is not charged: the place is held, unwritten,
-- until `lost + max`, and starts fresh after. Returns that instant while
-- it holds, else nil. `src/limiter/local/decide.rs` (`lost_fill`) is the
-- specification.
local function lost_fill(r, G, now)
  local h = r.h
  if hget(h.hash, h.p .. 'fp') ~= nil then
    -- Written by a replica's restore (restore.lua) while the loss held
    -- it: held all the same until the bound, so that every replica's
    -- part is in before a grant reads it.
    local held = hget(h.hash, h.p .. 'rh')
    if held == nil then
      return nil
    end
    held = tonumber(held)
    if now < held then
      return held
    end
    -- Past it: gone, so the place is back on the common path.
    widen(h.hash)
    h.hash.t[h.p .. 'rh'] = nil
    h.hash.dirty[h.p .. 'rh'] = true
    return nil
  end
  local lost = guard_lost(G, now)
  if lost == nil then
    return nil
  end
  -- An epoch ahead of this call's clock (a failover to a node whose
  -- clock is behind) counts as now: no algorithm reads a take it has not
  -- reached yet.
  lost = math.min(lost, now)
  local cap = r.algo.cap(r)
  local st = r.algo.load(h, r, lost)
  local reach = r.algo.reset(st, r, lost, cap)
  if now >= lost + reach then
    return nil
  end
  if G.max ~= nil and reach > G.max then
    if now < lost + G.max then
      return lost + G.max
    end
    return nil
  end
  r.algo.take(h, st, r, lost, cap, 'lost')
  put(h, 'fp', r.fp)
  return nil
end

-- A partial loss (issue 52, item 3): Redis failed over to a replica that
-- missed the last writes, or a seller's key was put back from an older
-- copy. The epoch survives that, so lost_fill sees nothing; the seller's
-- hash simply holds less than its replicas were granted. Each replica
-- carries, per seller, the instant of its own last grant there and how
-- long the state must live after it (its reply's reset: the hash cannot
-- have expired before), and writes that instant into the seller's hash
-- as `w:<tag>` (its tag: a short name of the replica) with every grant.
-- A call that finds its own mark older than what it carries, while the
-- state must still be there and after the epoch's last loss, has found
-- the state moved backwards: it refuses to go on from it. It holds the
-- whole hash until now plus the bound (`ph`; `pf` names the find), and
-- lists the find in the rollbacks key (`reg`), which every replica
-- watches: each writes back its grants since the point the state went
-- back to (restore.lua). A find needs a bounded 'wait' guard and the
-- marks (`seen`, from the call's ARGV); the hold is read by every
-- guarded call.
--
-- The seen token: '<tag> <e1>,<e2>,...', one entry per request, each
-- '<at µs>:<live until µs>' or '-' (nothing carried).
local function parse_seen(token)
  if token == nil or token == '' then
    return nil, nil
  end
  local tag, list = string.match(token, '^(%S+) (.*)$')
  if tag == nil then
    return nil, nil, 'malformed seen token'
  end
  local seen, q = {}, 0
  for e in string.gmatch(list, '[^,]+') do
    q = q + 1
    local at, live = string.match(e, '^(%d+):(%d+)$')
    if at ~= nil then
      seen[q] = { at = tonumber(at), live = tonumber(live) }
    elseif e ~= '-' then
      return nil, nil, 'malformed seen entry ' .. e
    end
  end
  return tag, seen
end

-- Adds a call's partial-loss marks to its guard (rollback_hold, below):
-- `token` the seen token, `reg` the rollbacks key, `srv` the server key
-- (server_moved). Returns an error message for a malformed token.
local function guard_seen(G, token, reg, srv)
  local tag, seen, err = parse_seen(token)
  if err ~= nil then
    return err
  end
  if tag ~= nil and (reg == nil or srv == nil) then
    return 'a call with seen marks needs the rollbacks and server keys after the epoch key'
  end
  G.tag, G.seen, G.reg, G.srv = tag, seen, reg, srv
  return nil
end

-- How long the rollbacks key keeps a find: far past any bound, so a
-- replica that missed a read still finds it.
local ROLLED_KEEP_US = 600000000

-- Lists a find in the rollbacks key for every replica's watch: at `now`,
-- the finder's own mark `mine`, the hash `key` ('*': every hash).
local function list_find(G, now, mine, key)
  redis.call('ZADD', G.reg, I(now), I(now) .. ' ' .. I(mine) .. ' ' .. key)
  redis.call('ZREMRANGEBYSCORE', G.reg, '-inf', '(' .. I(now - ROLLED_KEEP_US))
  redis.call('PEXPIRE', G.reg, cdiv(ROLLED_KEEP_US, 1000))
  if G.found == 0 then
    G.found = 3
  end
end

-- A failover to a replica that missed the last writes, or a restart that
-- loaded an older save: every key went back together, the replicas'
-- marks with the state, so a replica that granted nothing since that
-- point finds its mark whole and would grant from the older state (the
-- marks alone caught only the replicas that lost a grant: fleet seeds
-- 197, 613, 661, 1354 and 1610). What no key can keep, the server tells:
-- each Redis process has its own run id (a promoted replica too, and a
-- restart draws a new one), and the server key (`srv`, beside the
-- epoch) names the run id the limiter last ran on. A charging call that
-- finds another one found the store possibly gone back, whichever
-- replica makes it: it writes the find and its hold (the find plus the
-- bound) into the key and lists one find for every hash ('*'); every
-- seller hash is then held until that hold, named by the find (its
-- `pf`), and each replica writes back, into each seller hash it granted
-- in, what it was granted after its own mark there (restore.lua). A
-- restart or a failover that lost nothing costs the same hold. A loss of
-- every key takes the server key too: the epoch's path covers it, and
-- the first call writes the key anew (as on a new install).
--
-- A server key missing beside an epoch is a move too: the store went
-- back to a copy from before the limiter's first call on that server
-- (simulation seed 2973: a failover 1.7 s back, 2.4 s into an install,
-- let a seller through twice). A call that carries the server key
-- writes it with the epoch (state_epoch), so only an upgrade from a
-- version without the key, or restores switched on, meet that otherwise:
-- once, for the same hold.
-- Returns the last move found, { found, hold } (found 0: none), or nil
-- when the call does not look (no marks, a dry run, no bounded 'wait');
-- reads the server once per call.
local function server_moved(G, now)
  if G.moved ~= nil then
    return G.moved or nil
  end
  G.moved = false
  if G.srv == nil or not G.charge or not G.wait or G.max == nil then
    return nil
  end
  local run = server_run()
  local was, found, hold = read_server(G.srv)
  if was == nil and not redis.call('GET', G.key) then
    redis.call('SET', G.srv, run .. ' 0 0')
    found, hold = 0, 0
  elseif was ~= run then
    found, hold = now, now + G.max
    redis.call('SET', G.srv, run .. ' ' .. I(found) .. ' ' .. I(hold))
    list_find(G, now, 0, '*')
  end
  G.moved = { found = found, hold = hold }
  return G.moved
end

-- Holds seller hash `H` for a find at `found` until `hold`, and names
-- the find (`pf`), which a restore must match (restore.lua); a hash
-- already named by that find (or a later one) keeps what it has.
local function hold_for(H, found, hold)
  if num(hget(H, 'pf'), -1) >= found then
    return
  end
  hset(H, 'ph', I(hold))
  hset(H, 'pf', I(found))
  local ms = cdiv(hold - found, 1000) + EXPIRY_SLACK_MS
  if ms > H.ttl then
    H.ttl = ms
  end
end

-- The instant a rollback holds request `q`'s seller hash `H` until (nil:
-- none). Finds one when this replica's mark says so (see above), or when
-- the server moved (server_moved).
local function rollback_hold(G, H, q, now)
  if G == nil then
    return nil
  end
  local moved = server_moved(G, now)
  if moved ~= nil and now < moved.hold then
    hold_for(H, moved.found, moved.hold)
    return moved.hold
  end
  local ph = hget(H, 'ph')
  if ph ~= nil then
    ph = tonumber(ph)
    if now < ph then
      return ph
    end
    -- Past it: gone (`pf` stays, for a late restore's check).
    widen(H)
    H.t.ph = nil
    H.dirty.ph = true
  end
  local e = G.seen ~= nil and G.seen[q] or nil
  if e == nil or not G.charge or not G.wait or G.max == nil or now >= e.live then
    return nil
  end
  local mine = num(hget(H, 'w:' .. G.tag), 0)
  if mine >= e.at then
    return nil
  end
  -- A hash that is not there, or was made again after this replica's
  -- grant (`c0`: the first mark since it was made), expired in between
  -- (its own places may drain long before a global rule's, which the
  -- reply's reset counts): nothing to find. A key put back whole from an
  -- older copy keeps its `c0`.
  if not H.old or num(hget(H, 'c0'), e.at + 1) > e.at then
    return nil
  end
  -- A grant from before the epoch's last loss: a whole loss, which the
  -- epoch's own restores cover.
  if G.at == nil then
    G.at, G.found = state_epoch(G.key, now, G.charge, G.fresh, G.srv)
  end
  if G.at >= e.at then
    return nil
  end
  local hold = now + G.max
  hold_for(H, now, hold)
  list_find(G, now, mine, H.key)
  return hold
end

-- How long a whole use of rule `r` taken at `at` counts: the longest any
-- state of it can need keeping.
local function whole_use_reach(r, at)
  local h = r.h
  local empty = { key = h.key, p = h.p, hash = { raw = {}, w = {}, ttl = 0 } }
  return r.algo.reset(r.algo.load(empty, r, at), r, at, r.algo.cap(r))
end

-- Marks this replica's grant in the seller's hash (see rollback_hold),
-- and in every other hash the grant charged (the global rules'): after a
-- move of the server, each replica's restore of a hash counts only what
-- it was granted after its mark there (restore.lua), so a hash without
-- the marks would get back nothing of what the move took (simulation
-- seed 4992: 19 calls in a global window of 10).
-- A busy seller's hash never expires, so the marks of replicas gone since
-- (every deploy brings new ones) would pile up in it. A replica carries
-- its mark only while its grant's reset runs, which should end within a
-- whole use's reach; a mark far older than that (PRUNE_REACHES reaches
-- and a minute) goes whenever the hash is read as a table (past
-- SCAN_FIELDS fields, where the marks would be). The margin is wide on
-- purpose: pruned at one reach, the simulation found marks still carried
-- (fleet seeds 7 and 15: finds with no loss), a cause not yet traced.
local PRUNE_REACHES, PRUNE_SLACK_US = 4, 60000000
local function mark_hash(G, H, now, rules)
  -- Forward only: a clock that stepped back (a failover to a node whose
  -- clock is behind) must not leave the mark below a grant the replica
  -- carries.
  if num(hget(H, 'w:' .. G.tag), 0) < now then
    hset(H, 'w:' .. G.tag, I(now))
  end
  if H.t == nil then
    return
  end
  local reach = 0
  for i = 1, #rules do
    reach = math.max(reach, whole_use_reach(rules[i], now))
  end
  for f, v in pairs(H.t) do
    if string.sub(f, 1, 2) == 'w:' and tonumber(v) < now - PRUNE_REACHES * reach - PRUNE_SLACK_US then
      H.t[f] = nil
      H.dirty[f] = true
    end
  end
end

local function mark_grant(G, H, now, rules)
  if G == nil or G.tag == nil then
    return
  end
  mark_hash(G, H, now, rules)
  if hget(H, 'c0') == nil then
    hset(H, 'c0', I(now))
  end
  local done = { [H] = true }
  for i = 1, #rules do
    local R = rules[i].h.hash
    if not done[R] then
      done[R] = true
      mark_hash(G, R, now, rules)
    end
  end
end

-- A rule's state as the decision reads it, its place first made its own
-- (settle) and, when a call guards against a loss (G), filled as lost_fill
-- says; second, the instant a bounded loss holds the place until (nil:
-- none).
local function load_rule(r, now, G)
  settle(r, now)
  local hold = nil
  if G ~= nil then
    hold = lost_fill(r, G, now)
  end
  return r.algo.load(r.h, r, now), hold
end

-- Charges n units to a rule and names the rule at its place.
local function take_rule(r, st, now, n, id)
  r.algo.take(r.h, st, r, now, n, id)
  stamp(r)
end

-- Gives back units of a call to a rule, while the rule that took them is
-- still at its place.
local function refund_rule(r, at, n, id, skip, taken)
  if owns(r) then
    r.algo.refund(r.h, r, at, n, id, skip, taken)
  end
end

-- Debt of a TAT-based algorithm (gcra, leaky_bucket), in units of µs * limit:
-- how far the theoretical arrival time `u + f/limit` lies beyond `now`.
local function tat_debt(u, f, limit, now)
  if u < now then
    return 0
  end
  return (u - now) * limit + f
end

-- Store a TAT `now + debt/limit` exactly as whole µs `u` and remainder `f`.
local function tat_store(h, debt, limit, now)
  local whole = fdiv(debt, limit)
  put(h, 'tat', I(now + whole), 'f', I(debt - whole * limit))
  expire_in(h, cdiv(debt, limit))
end

-- Debt (µs * limit) that a refund of n units taken at `taken` may give back
-- at `at` when other calls may have taken since: n * period less what has
-- drained since the take. Why this is safe: with x the queue end (TAT)
-- before the take, each later take maps x to max(x, t) + m*T, and their
-- composition is max(x + M, c) with c <= at + M (every take since happened at
-- or before `at`). With and without the refunded units, the queue ends then
-- differ by at least min(n*T, x + n*T - max(x, at)) >= n*T - (at - taken),
-- since x >= taken. token_bucket is the same with the deficit for the debt.
local function drained_refund(r, n, at, taken)
  return math.max(0, n * r.period - (at - taken) * r.limit)
end
