-- GCRA (rl-core/src/algorithm/gcra.rs): one STRING holding the theoretical
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

  -- Decides on the state `value` (the key's GET, false when missing) for
  -- a cost of `cost` under threshold `t`, period `p` and burst `b`; commits
  -- to `key`. (gc_ahead and the TTL are written out here, everything in
  -- locals: this is every GCRA decision's path, and a Lua call or a table
  -- access costs about as much as either.)
  function M.decide_at(key, value, now, cost, t, p, b, commit)
    local interval = cdiv(p, t)
    local tau = interval * b
    local d = 0
    local tat = tonumber(value)
    if tat and tat > now then
      d = tat - now
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
    redis.call('SET', key, now + nd, 'PX', ms + EXTRA_TTL_MS)
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
  -- cost * I. ratewall Tat::unreserve.
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
