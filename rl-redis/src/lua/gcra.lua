-- GCRA (rl-core/src/algorithm/gcra.rs): one 24-byte STRING, three
-- little-endian doubles packed with Redis' `struct` library: the theoretical
-- arrival time (TAT, us), the emission interval it was measured in and when
-- it was written; it expires at the TAT.
-- I = ceil(P / T), tau = I * B. Computed relative to now (d = TAT - now) so
-- that no intermediate holds an absolute time plus tau.
-- A state measured in another interval (a limit changed at run time) is
-- read converted, TAT' = w + ceil((TAT - w) * I / I_old): the calls made
-- still count, as units of the new limit, draining at the new rate from the
-- last write, until the expiry that write set (ratewall Tat::measured_in);
-- the time converted is kept to DEBT_CAP (only debt reaches it).
LOADERS.gc = function()
  local M = {}

  -- TAT - now in interval `interval` (see the header), 0 when fresh.
  local function gc_ahead(value, now, interval)
    if not value or #value ~= 24 then
      return 0
    end
    local tat, was, w = struct.unpack('<ddd', value)
    if tat <= now then
      return 0
    end
    if was ~= interval and tat > w then
      tat = w + math.min(math.ceil((tat - w) * interval / was), DEBT_CAP)
    end
    return math.max(tat - now, 0)
  end

  -- Decides on the state `value` (the key's GET, false when missing) for
  -- a cost of `cost` under threshold `t`, period `p` and burst `b`; commits
  -- to `key`. (The TTL is written out here, everything in locals: this is
  -- every GCRA decision's path, and a Lua call or a table access costs
  -- about as much as either.)
  function M.decide_at(key, value, now, cost, t, p, b, commit)
    local interval = cdiv(p, t)
    local tau = interval * b
    local d = 0
    if value and #value == 24 then
      local tat, was, w = struct.unpack('<ddd', value)
      if tat > now then
        if was ~= interval and tat > w then
          tat = w + math.min(math.ceil((tat - w) * interval / was), DEBT_CAP)
        end
        if tat > now then
          d = tat - now
        end
      end
    end
    local nd = d + cost * interval
    if nd > tau then
      return 0, b, idiv(math.max(tau - d, 0), interval), nd - tau, d
    end
    if not commit then
      return 1, b, idiv(tau - d, interval), 0, d
    end
    local ms = 1
    if nd > 1000 then
      ms = cdiv(nd, 1000)
    end
    redis.call('SET', key, struct.pack('<ddd', now + nd, interval, now), 'PX', ms + EXTRA_TTL_MS)
    return 1, b, idiv(tau - nd, interval), 0, nd
  end

  -- The same for a request (batch.lua, lease.lua), its read cached
  -- (get_cached, written out).
  local decide_at = M.decide_at
  function M.decide(r, now, commit)
    local value = r.st
    if value == nil then
      value = redis.call('GET', r.key)
      r.st = value
    end
    return decide_at(r.key, value, now, r.cost, r.t, r.p, r.b, commit)
  end

  -- (Every module's refund answers true when it gave something back: the
  -- state held units it no longer holds; nil otherwise.)
  function M.refund(r, now, _)
    local interval = cdiv(r.p, r.t)
    local value = get_cached(r)
    if not value then
      return
    end
    local ahead = gc_ahead(value, now, interval)
    local back = ahead - r.cost * interval
    -- Spent already (perhaps only once converted to a changed interval):
    -- emptied, as ratewall's Tat::refund does, so that the state does not
    -- come back if the limit returns to the interval it was written in.
    if back <= 0 then
      redis.call('DEL', r.key)
    else
      redis.call('SET', r.key, struct.pack('<ddd', now + back, interval, now), 'PX', ttl_ms(now + back, now))
    end
    return ahead > 0
  end

  -- Takes r.cost more whatever the limit says: the TAT moves past the
  -- tolerance (debt, at most DEBT_CAP ahead). ratewall Tat::charge.
  function M.charge(r, now)
    local interval = cdiv(r.p, r.t)
    local ahead = math.min(gc_ahead(get_cached(r), now, interval) + r.cost * interval, DEBT_CAP)
    redis.call('SET', r.key, struct.pack('<ddd', now + ahead, interval, now), 'PX', ttl_ms(now + ahead, now))
  end

  -- Raises the TAT so that at most r.cost units remain `after` us from
  -- now: TAT - now >= after + tau + 1 - (left + 1) * I, `after` kept to
  -- DEBT_CAP - tau. ratewall Tat::hold.
  function M.hold(r, now, after)
    local interval = cdiv(r.p, r.t)
    local tau = interval * r.b
    local needed = math.min(after, math.max(DEBT_CAP - tau, 0)) + tau + 1 - (r.cost + 1) * interval
    if needed <= gc_ahead(get_cached(r), now, interval) then
      return
    end
    local ahead = math.min(needed, DEBT_CAP)
    redis.call('SET', r.key, struct.pack('<ddd', now + ahead, interval, now), 'PX', ttl_ms(now + ahead, now))
  end

  -- The TAT of a state (false when there is none): what a lease left.
  function M.tat(value)
    if not value or #value ~= 24 then
      return false
    end
    local tat = struct.unpack('<ddd', value)
    return tat
  end

  -- Takes back the reservation that left the TAT at `mark` if it is still
  -- the last one made (the TAT unchanged since): the TAT goes back by
  -- cost * I. ratewall Tat::unreserve.
  function M.unreserve(r, now, _, mark)
    local value = get_cached(r)
    if not value or #value ~= 24 then
      return false
    end
    local tat, was, w = struct.unpack('<ddd', value)
    if tat ~= mark then
      return false
    end
    local back = tat - r.cost * cdiv(r.p, r.t)
    if back <= now then
      redis.call('DEL', r.key)
    else
      redis.call('SET', r.key, struct.pack('<ddd', back, was, w), 'PX', ttl_ms(back, now))
    end
    return true
  end

  return M
end
