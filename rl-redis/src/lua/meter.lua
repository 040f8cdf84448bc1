-- Token bucket and leaky bucket (rl-core/src/algorithm/meter.rs): one meter
-- scaled by P so refill and drain stay integers (T scaled units per us, one
-- unit = P scaled units, capacity B * P).
-- State: one 24-byte string, three little-endian doubles packed with Redis'
-- `struct` library (every value is an integer below 2^53, so exact; a value
-- this short is stored in one allocation, unlike a HASH or decimal text):
-- s = the level (units in use x P, for both: a token bucket's tokens are
-- B * P - s), u = time of the last update, e = time it is back to fresh:
-- e = now + ceil(level / T), computed with the limit that wrote it (a
-- changed threshold or burst reads the same level, the calls made still
-- counting as units of the new limit, and does not revive an expired
-- state), which is also when the key expires. A meter back to fresh is
-- deleted.

local function meter_module()
  -- The level (units in use x P) at `now`; 0 when fresh. Drained since
  -- the last update, or, before a reservation written as of a later time
  -- (u > now), higher by the drain still to come until then.
  local function meter_level(r, now)
    local value = get_cached(r)
    if not value then
      return 0
    end
    if #value ~= 24 then
      return 0
    end
    local scaled, updated, e = struct.unpack('<ddd', value)
    if now >= e then
      return 0
    end
    local level = scaled
    if now < updated then
      return level + (updated - now) * r.t
    end
    -- A product beyond 2^53 is inexact but then exceeds every level, so
    -- the clamp below gives the exact result.
    local drained = (now - updated) * r.t
    if drained >= level then
      return 0
    end
    return level - drained
  end

  local function meter_store(r, now, level)
    if level <= 0 then
      redis.call('DEL', r.key)
      return
    end
    local scaled = level
    local expires_at = now + cdiv(level, r.t)
    redis.call('SET', r.key, struct.pack('<ddd', scaled, now, expires_at), 'PX', ttl_ms(expires_at, now))
  end

  -- Decides on the state `value` (the key's GET, false when missing) for
  -- a cost of `cost` under threshold `t`, period `p` and burst `b`; commits
  -- to `key`. (The read of meter_level and the write of meter_store are
  -- written out here, everything in locals: this is every bucket decision's
  -- path, and a Lua call or a table access costs about as much as what
  -- either does.)
  local function meter_decide_at(key, value, now, cost, t, p, b, commit)
    local full = b * p
    local level = 0
    if value and #value == 24 then
      local scaled, updated, e = struct.unpack('<ddd', value)
      if now < e then
        local held = scaled
        if now < updated then
          level = held + (updated - now) * t
        else
          local drained = (now - updated) * t
          if drained < held then
            level = held - drained
          end
        end
      end
    end
    local need = cost * p
    if need > full - level then
      local remaining = idiv(math.max(full - level, 0), p)
      return 0, b, remaining, cdiv(need - (full - level), t), cdiv(level, t)
    end
    if commit then
      level = level + need
      local empty_in = cdiv(level, t)
      -- level > 0: a cost is at least one unit.
      local scaled = level
      local ms = 1
      if empty_in > 1000 then
        ms = cdiv(empty_in, 1000)
      end
      redis.call('SET', key, struct.pack('<ddd', scaled, now, now + empty_in), 'PX', ms + EXTRA_TTL_MS)
      return 1, b, idiv(full - level, p), 0, empty_in
    end
    return 1, b, idiv(full - level, p), 0, cdiv(level, t)
  end

  -- The same for a request (batch.lua, lease.lua), its read cached
  -- (get_cached, written out).
  local function meter_decide(r, now, commit)
    local value = r.st
    if value == nil then
      value = redis.call('GET', r.key)
      r.st = value
    end
    return meter_decide_at(r.key, value, now, r.cost, r.t, r.p, r.b, commit)
  end

  local function meter_refund(r, now, _)
    if not get_cached(r) then
      return
    end
    local was = meter_level(r, now)
    meter_store(r, now, math.max(was - r.cost * r.p, 0))
    return was > 0
  end

  -- Takes r.cost more whatever the limit says: the level past the
  -- capacity is debt (up to DEBT_CAP). ratewall Meter::charge.
  local function meter_charge(r, now)
    local level = meter_level(r, now) + r.cost * r.p
    meter_store(r, now, math.min(level, DEBT_CAP))
  end

  -- Raises the level so that at most r.cost units remain `after` us from
  -- now (by then it drains after * T). ratewall Meter::hold.
  local function meter_hold(r, now, after)
    local left = r.cost
    if left >= r.b then
      return
    end
    local now_level = math.min((r.b - left - 1) * r.p + 1 + after * r.t, DEBT_CAP)
    if meter_level(r, now) >= now_level then
      return
    end
    meter_store(r, now, now_level)
  end

  -- Takes back the reservation written as of `at` that left the meter
  -- fresh again at `mark`, if it is still the last write: its cost * P
  -- comes off the level as of `at`. ratewall Meter::unreserve.
  local function meter_unreserve(r, now, at, mark)
    local value = get_cached(r)
    if not value or #value ~= 24 then
      return false
    end
    local scaled, updated, e = struct.unpack('<ddd', value)
    if updated ~= at or e ~= mark then
      return false
    end
    local level = scaled - r.cost * r.p
    if level <= 0 and at > now then
      -- Empty as of `at`, still draining until then: the state the queue
      -- had before this reservation.
      scaled = 0
      redis.call('SET', r.key, struct.pack('<ddd', scaled, at, at), 'PX', ttl_ms(at, now))
      return true
    end
    local expires_at = at + cdiv(math.max(level, 0), r.t)
    if level <= 0 or expires_at <= now then
      redis.call('DEL', r.key)
      return true
    end
    scaled = level
    redis.call('SET', r.key, struct.pack('<ddd', scaled, at, expires_at), 'PX', ttl_ms(expires_at, now))
    return true
  end

  -- When the state was last updated and when it is fresh again (nil for
  -- no state): what a lease left it at.
  local function meter_stamp(value)
    if not value or #value ~= 24 then
      return nil, nil
    end
    local _, updated, e = struct.unpack('<ddd', value)
    return updated, e
  end

  return {
    stamp = meter_stamp,
    decide = meter_decide,
    decide_at = meter_decide_at,
    refund = meter_refund,
    charge = meter_charge,
    hold = meter_hold,
    unreserve = meter_unreserve,
  }
end

-- The two flavours are one meter seen from either side: one module each
-- (the batch and the library look modules up by code).
LOADERS.tb = function() return meter_module() end
LOADERS.lb = function() return meter_module() end
