-- GCRA (rl-core algorithm/gcra.rs): one STRING holding the theoretical
-- arrival time (TAT, us), expiring at the TAT.
-- I = ceil(P / T), tau = I * B. Computed relative to now (d = TAT - now) so
-- that no intermediate holds an absolute time plus tau.
LOADERS.gc = function()
  local M = {}

  -- TAT - now, 0 when there is no TAT in the future (fresh).
  local function gc_ahead(r, now)
    local tat = tonumber(get_cached(r))
    if tat and tat > now then
      return tat - now
    end
    return 0
  end

  -- (gc_ahead and the TTL are written out here: this is every GCRA
  -- decision's path, and a Lua call costs about as much as either.)
  function M.decide(r, now, commit)
    local b = r.b
    local interval = cdiv(r.p, r.t)
    local tau = interval * b
    local st = r.st
    if st == nil then
      st = redis.call('GET', r.key)
      r.st = st
    end
    local d = 0
    local tat = tonumber(st)
    if tat and tat > now then
      d = tat - now
    end
    local nd = d + r.cost * interval
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
    redis.call('SET', r.key, now + nd, 'PX', ms + EXTRA_TTL_MS)
    return 1, b, idiv(tau - nd, interval), 0, nd
  end

  function M.refund(r, now, _)
    local d = gc_ahead(r, now)
    if d == 0 then
      return
    end
    local back = d - r.cost * cdiv(r.p, r.t)
    if back <= 0 then
      redis.call('DEL', r.key)
    else
      redis.call('SET', r.key, now + back, 'PX', ttl_ms(now + back, now))
    end
  end

  -- Takes back the reservation that left the TAT at `mark` if it is still
  -- the last one made (the TAT unchanged since): the TAT goes back by
  -- cost * I. rl-core Tat::unreserve.
  function M.unreserve(r, now, _, mark)
    local tat = tonumber(get_cached(r))
    if tat ~= mark then
      return false
    end
    local back = tat - r.cost * cdiv(r.p, r.t)
    if back <= now then
      redis.call('DEL', r.key)
    else
      redis.call('SET', r.key, back, 'PX', ttl_ms(back, now))
    end
    return true
  end

  return M
end
