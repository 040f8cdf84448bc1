-- Quota leasing (rl-core/src/layer/lease.rs): one call decides a batch's costs
-- all-or-nothing, as an acquire does, and when every request is allowed
-- takes up to `extra` more units per request in the same step (the lease);
-- another gives a lease's unused units back.
--
-- args: op ('lease' | 'release'), time ('s' = server TIME, or the client's
-- now in us), extra TTL (ms), record TTL (us: how long the caller uses a
-- lease at most), then per request: algorithm code, threshold, period (us),
-- burst, slots, cost, then
--   lease:   extra (units asked for beyond the cost), 0, 0;
--   release: the lease's decision time (us), its stamp (the expiry it left
--            the state with), the units it was granted; `cost` is the
--            number of units given back.
-- keys: per request the state key `<key>:<algorithm>:<period>`, then
-- `<state key>:leases`: a sorted set
-- of the leases taken (member `<at>:<granted>`, score: the last time the
-- units can be used), for operators (the `ratewall` CLI). All keys share one hash tag.
--
-- Reply (lease): per request allowed (1/0), limit, remaining,
-- retry_after_us, reset_after_us, granted; then the now used.
-- (release): the now used.
--
-- How many units a lease takes: up to `extra`, at most half of what is
-- left after the call's own cost (ratewall MemoryBackend::lease_size), so
-- processes asking for a limit's last units share them. A limit whose
-- algorithm cannot lease (the sliding log) is granted nothing.
--
-- Giving back: the window algorithms refund into the lease's window or slot
-- (their `refund`); GCRA and the meters only while the state is the one the
-- lease left (GCRA: the TAT equals the stamp; a meter: updated at the
-- lease's time and expiring at the stamp), where the unused units are the
-- last ones scheduled. Otherwise nothing is given back: the units lapse.

local LEASE_HEADER, LEASE_FIELDS = 4, 9

-- Whether the state is still the one a lease taken at `at` left (stamp):
-- true for the window algorithms, which count per window or slot.
local function lease_state_kept(r, now, at, stamp)
  if r.alg == 'gc' then
    return ALG.gc.tat(get_cached(r)) == stamp
  end
  if r.alg == 'tb' or r.alg == 'lb' then
    local updated, e = ALG[r.alg].stamp(get_cached(r))
    return updated ~= nil and updated == at and e == stamp and now < e
  end
  return r.alg == 'fw' or r.alg == 'sw'
end

-- The last time the units of a lease taken at `now` can be used (never
-- later than `ttl` after it), for its record.
local function lease_last(r, now, reset_after, ttl)
  local last = now + reset_after
  if r.alg == 'sw' then
    local size = idiv(r.p, r.slots)
    last = (idiv(now, size) + 1) * size
  end
  return math.min(last, now + ttl)
end

local function lease(keys, args)
  if #args < LEASE_HEADER or (#args - LEASE_HEADER) % LEASE_FIELDS ~= 0 then
    return redis.error_reply('ERR ratewall-redis: malformed arguments (' .. #args .. ')')
  end
  local op = args[1]
  local now = clock(args[2])
  EXTRA_TTL_MS = tonumber(args[3]) or 0
  local record_ttl = tonumber(args[4]) or 0

  local count = (#args - LEASE_HEADER) / LEASE_FIELDS
  local requests = {}
  local next_key = 1
  for i = 1, count do
    local a = LEASE_HEADER + (i - 1) * LEASE_FIELDS
    local r, unknown = request_at(args, a, LEASE_FIELDS, keys[next_key])
    if r == nil then
      return unknown
    end
    next_key = next_key + 1
    r.leases = keys[next_key]
    next_key = next_key + 1
    requests[i] = r
  end
  if next_key - 1 ~= #keys then
    return redis.error_reply('ERR ratewall-redis: expected ' .. (next_key - 1) .. ' keys, got ' .. #keys)
  end

  if op == 'lease' then
    local out = {}
    local room = {}
    local all = true
    -- First pass: every request evaluated without writing.
    for i = 1, count do
      local r = requests[i]
      local allowed, limit, remaining, retry_after, reset_after = ALG[r.alg].decide(r, now, false)
      if remaining < 0 then
        remaining = 0
      end
      room[i] = remaining
      local o = (i - 1) * 6
      out[o + 1] = allowed
      out[o + 2] = limit
      out[o + 3] = remaining
      out[o + 4] = retry_after
      out[o + 5] = reset_after
      out[o + 6] = 0
      if allowed ~= 1 then
        all = false
      end
    end
    if all then
      for i = 1, count do
        local r = requests[i]
        local granted = 0
        if LEASES[r.alg] and r.x > 0 then
          granted = math.min(r.x, idiv(math.max(room[i] - r.cost, 0), 2))
        end
        for j = 1, i - 1 do
          if requests[j].key == r.key then
            r.st = nil
          end
        end
        r.cost = r.cost + granted
        local allowed, limit, remaining, retry_after, reset_after = ALG[r.alg].decide(r, now, true)
        if remaining < 0 then
          remaining = 0
        end
        local o = (i - 1) * 6
        out[o + 1] = allowed
        out[o + 2] = limit
        out[o + 3] = remaining
        out[o + 4] = retry_after
        out[o + 5] = reset_after
        out[o + 6] = granted
        if granted > 0 then
          local last = lease_last(r, now, reset_after, record_ttl)
          redis.call('ZREMRANGEBYSCORE', r.leases, '-inf', '(' .. fmt(now))
          redis.call('ZADD', r.leases, last, fmt(now) .. ':' .. fmt(granted))
          if redis.call('PTTL', r.leases) < ttl_ms(last, now) then
            expire(r.leases, last, now)
          end
        end
      end
    end
    out[#out + 1] = now
    return out
  elseif op == 'release' then
    for i = 1, count do
      local r = requests[i]
      local at, stamp, granted = r.x, r.y, r.z
      if r.cost > 0 and lease_state_kept(r, now, at, stamp) then
        ALG[r.alg].refund(r, now, at)
      end
      redis.call('ZREM', r.leases, fmt(at) .. ':' .. fmt(granted))
    end
    return { now }
  end
  return redis.error_reply('ERR ratewall-redis: unknown lease operation ' .. tostring(op))
end
