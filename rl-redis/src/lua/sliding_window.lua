-- Sliding-window counter (rl-core/src/algorithm/sliding_window.rs).
-- State: HASH { slot index = count }, N slots of S = P / N us. Slots older
-- than s - N are left out of every computation and deleted on every write,
-- so the hash holds at most N + 2 fields. Expires at (m + N + 1) * S for the
-- newest non-empty slot m.
LOADERS.sw = function()
  local M = {}

  -- Counts of the live slots (index >= s - N) by index, the fields of older
  -- slots, and the newest non-empty slot index (nil when there is none).
  local function sw_read(r)
    return redis.call('HGETALL', r.key)
  end

  local function sw_load(r, s)
    local n = r.slots
    local raw = cached(r, sw_read)
    local cnt, stale, newest = {}, {}, nil
    for j = 1, #raw, 2 do
      local i, c = tonumber(raw[j]), tonumber(raw[j + 1])
      if i + n < s then
        stale[#stale + 1] = raw[j]
      else
        cnt[i] = c
        if c > 0 and (newest == nil or i > newest) then
          newest = i
        end
      end
    end
    return cnt, stale, newest
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
    local cnt, stale, newest = sw_load(r, s)
    local est = sw_estimate(cnt, n, size, now)
    local capacity = t * size
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
    local cnt, stale = sw_load(r, idiv(now, size))
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
    if newest == nil then
      redis.call('DEL', r.key)
    else
      expire(r.key, (newest + n + 1) * size, now)
    end
    return true
  end

  -- Adds `units` to slot `slot` (the current one, or an older one still in
  -- the window) of the state `sw_load` gave at `now`, whatever the limit
  -- says, a slot's count at most DEBT_CAP / P, and moves the expiry with
  -- the newest slot. ratewall Slots::add.
  local function sw_add(r, now, slot, units, cnt, stale, newest)
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
    expire(r.key, (newest + n + 1) * size, now)
  end

  -- Adds r.cost to the current slot (debt). ratewall Slots::charge.
  function M.charge(r, now)
    local s = idiv(now, idiv(r.p, r.slots))
    sw_add(r, now, s, r.cost, sw_load(r, s))
  end

  -- Until at most r.cost units remain `after` us from now: a count
  -- (after = 0) goes into the current slot, as a charge; a pause into the
  -- oldest slot still counted in full at now + after (at most the current
  -- one), so the window stays full until that slot leaves it. ratewall
  -- Slots::hold.
  function M.hold(r, now, after)
    local t, n, left = r.t, r.slots, r.cost
    if left >= t then
      return
    end
    local size = idiv(r.p, n)
    local s = idiv(now, size)
    local cnt, stale, newest = sw_load(r, s)
    -- The time the window must still be full at, and the slot that counts
    -- in full until then.
    local at, slot = now, s
    if after > 0 then
      at = math.min(now + after, (s + n) * size - 1)
      slot = math.max(idiv(at, size) + 1 - n, 0)
    end
    local floor = (t - left - 1) * size + 1
    local est = sw_estimate(cnt, n, size, at)
    if est < floor then
      sw_add(r, now, slot, cdiv(floor - est, size), cnt, stale, newest)
    end
  end

  return M
end
