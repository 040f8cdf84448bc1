-- Fixed window (rl-core/src/algorithm/fixed_window.rs).
-- State: one 16-byte string, two little-endian doubles packed with Redis'
-- `struct` library: the window index w and the count n in that window (both
-- integers below 2^53, so exact). One GET to read and one SET ... PX to
-- write, where a HASH took HMGET, HSET and PEXPIRE. Expires at the window's
-- end: (w + 1) * P.
LOADERS.fw = function()
  local M = {}

  -- The count in `window`, nil when the state is of another window (or
  -- there is none).
  local function fw_count(r, window)
    local value = get_cached(r)
    if not value or #value ~= 16 then
      return nil
    end
    local w, n = struct.unpack('<dd', value)
    if w ~= window then
      return nil
    end
    return n
  end

  local function fw_store(r, window, count, now)
    local p = r.p
    redis.call('SET', r.key, struct.pack('<dd', window, count), 'PX', ttl_ms((window + 1) * p, now))
  end

  -- Decides on the state `value` (the key's GET, false when missing) for
  -- a cost of `cost` under threshold `t` and period `p` (no burst: the
  -- last argument is unused); commits to `key`. (The read and the write of
  -- fw_count and fw_store are written out here, everything in locals: this
  -- is every fixed-window decision's path, and a Lua call or a table access
  -- costs about as much as what either does.)
  function M.decide_at(key, value, now, cost, t, p, _, commit)
    local window = idiv(now, p)
    local window_end_in = p - (now - window * p)
    local count = 0
    if value and #value == 16 then
      local w, n = struct.unpack('<dd', value)
      if w == window then
        count = n
      end
    end
    if cost > t - count then
      return 0, t, t - count, window_end_in, window_end_in
    end
    if commit then
      count = count + cost
      local ms = 1
      if window_end_in > 1000 then
        ms = cdiv(window_end_in, 1000)
      end
      redis.call('SET', key, struct.pack('<dd', window, count), 'PX', ms + EXTRA_TTL_MS)
    end
    local reset = 0
    if count > 0 then
      reset = window_end_in
    end
    return 1, t, t - count, 0, reset
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
    return decide_at(r.key, value, now, r.cost, r.t, r.p, nil, commit)
  end

  function M.refund(r, now, at)
    local at_window = idiv(at, r.p)
    -- Only the window the decision was made in, and only while it lasts
    -- (a window that has ended is equivalent to no state).
    local count = fw_count(r, at_window)
    if count == nil or (at_window + 1) * r.p <= now then
      return
    end
    local was = count
    count = count - r.cost
    if count <= 0 then
      redis.call('DEL', r.key)
    else
      fw_store(r, at_window, count, now)
    end
    return was > 0
  end

  -- Takes r.cost more in the current window whatever the limit says
  -- (debt, up to DEBT_CAP). ratewall Window::charge.
  function M.charge(r, now)
    local window = idiv(now, r.p)
    local count = fw_count(r, window) or 0
    fw_store(r, window, math.min(count + r.cost, DEBT_CAP), now)
  end

  -- Fills the current window so that at most r.cost units remain (a
  -- window holds nothing past its end). ratewall Window::hold.
  function M.hold(r, now, _)
    local left, t = r.cost, r.t
    if left >= t then
      return
    end
    local window = idiv(now, r.p)
    local count = fw_count(r, window) or 0
    if count >= t - left then
      return
    end
    fw_store(r, window, t - left, now)
  end

  return M
end
