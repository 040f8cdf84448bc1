-- Sliding-window counter (rl-core/src/algorithm/sliding_window.rs).
-- State: HASH { slot index = count }, N slots of S = P / N us, and during a
-- pause the field `h`, the pause's end (us): every call before it is
-- refused. Slots older than s - N, and an `h` past, are left out of every
-- computation and deleted on every write, so the hash holds at most N + 3
-- fields. Expires at (m + N + 1) * S for the newest non-empty slot m, or at
-- h if later.
LOADERS.sw = function()
  local M = {}

  local function sw_read(r)
    return redis.call('HGETALL', r.key)
  end

  -- Counts of the live slots (index >= s - N, s the slot of `now`) by
  -- index, the fields of older slots (and `h` when its pause is over), the
  -- newest non-empty slot index (nil when there is none), and the end of a
  -- pause still ahead (0: none).
  local function sw_load(r, s, now)
    local n = r.slots
    local raw = cached(r, sw_read)
    local cnt, stale, newest, held = {}, {}, nil, 0
    for j = 1, #raw, 2 do
      local field = raw[j]
      if field == 'h' then
        local h = tonumber(raw[j + 1])
        if h > now then
          held = h
        else
          stale[#stale + 1] = field
        end
      else
        local i, c = tonumber(field), tonumber(raw[j + 1])
        if i + n < s then
          stale[#stale + 1] = field
        else
          cnt[i] = c
          if c > 0 and (newest == nil or i > newest) then
            newest = i
          end
        end
      end
    end
    return cnt, stale, newest, held
  end

  -- When the key can go: the newest slot's expiry or the pause's end,
  -- whichever is later (0: nothing to keep).
  local function sw_expires(newest, n, size, held)
    if newest == nil then
      return held
    end
    return math.max((newest + n + 1) * size, held)
  end

  local function sw_sum(cnt, lo, hi)
    local sum = 0
    for i = math.max(lo, 0), hi do
      sum = sum + (cnt[i] or 0)
    end
    return sum
  end

  -- The estimate scaled by S at time `at`: the full slots inside the window
  -- plus the oldest slot weighted by the part of it still inside.
  local function sw_estimate(cnt, n, size, at)
    local s_at = idiv(at, size)
    local old = 0
    if s_at >= n then
      old = cnt[s_at - n] or 0
    end
    return size * sw_sum(cnt, s_at + 1 - n, s_at) + ((s_at + 1) * size - at) * old
  end

  -- First time >= now at which the estimate is <= target, minus now: walks at
  -- most N + 1 slot boundaries, keeping the sum of full slots incrementally.
  local function sw_retry(cnt, n, size, now, target)
    local s = idiv(now, size)
    local full = sw_sum(cnt, s + 1 - n, s)
    for j = 0, n do
      local start = now
      if j > 0 then
        start = (s + j) * size
        if s + j - n >= 0 then
          full = full - (cnt[s + j - n] or 0)
        end
        full = full + (cnt[s + j] or 0)
      end
      local finish = (s + j + 1) * size
      local old = 0
      if s + j >= n then
        old = cnt[s + j - n] or 0
      end
      local est = size * full + (finish - start) * old
      if est <= target then
        return start - now
      end
      if old > 0 then
        local wait = cdiv(est - target, old)
        if start + wait <= finish then
          return start + wait - now
        end
      end
    end
    return (s + n + 1) * size - now
  end

  local function sw_reset_after(newest, n, size, now)
    if newest == nil then
      return 0
    end
    return math.max((newest + n + 1) * size - now, 0)
  end

  function M.decide(r, now, commit)
    local t, n, c = r.t, r.slots, r.cost
    local size = idiv(r.p, n)
    local s = idiv(now, size)
    local cnt, stale, newest, held = sw_load(r, s, now)
    local capacity = t * size
    if held > 0 then
      -- Paused: room comes back at the pause's end at the earliest.
      -- ratewall Slots::decide.
      local retry = held - now + sw_retry(cnt, n, size, held, capacity - c * size)
      return 0, t, 0, retry, math.max(sw_reset_after(newest, n, size, now), held - now)
    end
    local est = sw_estimate(cnt, n, size, now)
    if c * size > capacity - est then
      local retry = sw_retry(cnt, n, size, now, capacity - c * size)
      local remaining = idiv(math.max(capacity - est, 0), size)
      return 0, t, remaining, retry, sw_reset_after(newest, n, size, now)
    end
    if commit then
      redis.call('HINCRBY', r.key, s, c)
      for j = 1, #stale do
        redis.call('HDEL', r.key, stale[j])
      end
      if newest == nil or s > newest then
        newest = s
      end
      est = est + c * size
      expire(r.key, (newest + n + 1) * size, now)
    end
    return 1, t, idiv(capacity - est, size), 0, sw_reset_after(newest, n, size, now)
  end

  function M.refund(r, now, at)
    local n = r.slots
    local size = idiv(r.p, n)
    local cnt, stale, _, held = sw_load(r, idiv(now, size), now)
    local i = idiv(at, size)
    local c = cnt[i]
    if c == nil or c <= 0 then
      return
    end
    c = math.max(c - r.cost, 0)
    cnt[i] = c
    if c == 0 then
      redis.call('HDEL', r.key, i)
    else
      redis.call('HSET', r.key, i, c)
    end
    for j = 1, #stale do
      redis.call('HDEL', r.key, stale[j])
    end
    local newest = nil
    for index, count in pairs(cnt) do
      if count > 0 and (newest == nil or index > newest) then
        newest = index
      end
    end
    local expires = sw_expires(newest, n, size, held)
    if expires == 0 then
      redis.call('DEL', r.key)
    else
      expire(r.key, expires, now)
    end
    return true
  end

  -- Adds `units` to slot `slot` (the current one, or an older one still in
  -- the window) of the state `sw_load` gave at `now`, whatever the limit
  -- says, a slot's count at most DEBT_CAP / P, and moves the expiry with
  -- the newest slot (a pause stays). ratewall Slots::add.
  local function sw_add(r, now, slot, units, cnt, stale, newest, held)
    local n = r.slots
    local size = idiv(r.p, n)
    local c = math.min((cnt[slot] or 0) + units, idiv(DEBT_CAP, r.p))
    redis.call('HSET', r.key, slot, c)
    for j = 1, #stale do
      redis.call('HDEL', r.key, stale[j])
    end
    if newest == nil or slot > newest then
      newest = slot
    end
    expire(r.key, sw_expires(newest, n, size, held), now)
  end

  -- Adds r.cost to the current slot (debt). ratewall Slots::charge.
  function M.charge(r, now)
    local s = idiv(now, idiv(r.p, r.slots))
    sw_add(r, now, s, r.cost, sw_load(r, s, now))
  end

  -- A pause (r.cost = 0 units left, after > 0) refuses every call until
  -- now + after (after kept to DEBT_CAP), as the field `h`; a count goes
  -- into the current slot, as a charge, until at most r.cost units remain
  -- (after is not held with it). ratewall Slots::hold.
  function M.hold(r, now, after)
    local t, n, left = r.t, r.slots, r.cost
    if left >= t then
      return
    end
    local size = idiv(r.p, n)
    local s = idiv(now, size)
    local cnt, stale, newest, held = sw_load(r, s, now)
    if after > 0 and left == 0 then
      local ends = now + math.min(after, DEBT_CAP)
      if ends > held then
        redis.call('HSET', r.key, 'h', ends)
        expire(r.key, sw_expires(newest, n, size, ends), now)
      end
      return
    end
    local floor = (t - left - 1) * size + 1
    local est = sw_estimate(cnt, n, size, now)
    if est < floor then
      sw_add(r, now, s, cdiv(floor - est, size), cnt, stale, newest, held)
    end
  end

  return M
end
