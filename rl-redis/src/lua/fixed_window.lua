-- Fixed window (rl-core/src/algorithm/fixed_window.rs).
-- State: one string, little-endian doubles packed with Redis' `struct`
-- library: the window index w and the count n in that window (16 bytes,
-- '<dd'), then, during a pause, the pause's end h in us (24 bytes, '<ddd';
-- every call before h is refused). All integers below 2^53, so exact. One
-- GET to read and one SET ... PX to write, where a HASH took HMGET, HSET
-- and PEXPIRE. Expires at the window's end, (w + 1) * P, or at h if later.
LOADERS.fw = function()
  local M = {}

  -- The window, its count and the pause's end (0: none) of a state
  -- (the key's GET: false when missing); window -1 when there is none.
  local function fw_state(value)
    if value then
      if #value == 16 then
        local w, n = struct.unpack('<dd', value)
        return w, n, 0
      elseif #value == 24 then
        local w, n, h = struct.unpack('<ddd', value)
        return w, n, h
      end
    end
    return -1, 0, 0
  end

  -- Writes window `window` with `count`, and the pause's end `held` while
  -- it is ahead; the key lives until both are over.
  local function fw_store(r, window, count, held, now)
    local expires = 0
    if count > 0 then
      expires = (window + 1) * r.p
    end
    if held > now then
      redis.call('SET', r.key, struct.pack('<ddd', window, count, held), 'PX', ttl_ms(math.max(expires, held), now))
    else
      redis.call('SET', r.key, struct.pack('<dd', window, count), 'PX', ttl_ms(expires, now))
    end
  end

  -- The refusal of a call of `cost` at `now`, before the pause's end `h`
  -- (window w, count n): room comes back at h, or at the end of the window
  -- h falls in if that window counts too much for `cost` then.
  -- ratewall Window::paused.
  local function fw_paused(w, n, h, now, cost, t, p)
    local hw = idiv(h, p)
    local retry, full = h, h
    if w == hw and n > 0 then
      full = (hw + 1) * p
      if cost > t - n then
        retry = full
      end
    end
    return 0, t, 0, retry - now, full - now
  end

  -- Decides on the state `value` (the key's GET, false when missing) for
  -- a cost of `cost` under threshold `t` and period `p` (no burst: the
  -- last argument is unused); commits to `key`. (The read and the write of
  -- fw_state and fw_store are written out here, everything in locals: this
  -- is every fixed-window decision's path, and a Lua call or a table access
  -- costs about as much as what either does.)
  function M.decide_at(key, value, now, cost, t, p, _, commit)
    local window = idiv(now, p)
    local window_end_in = p - (now - window * p)
    local count = 0
    if value then
      local size = #value
      if size == 16 then
        local w, n = struct.unpack('<dd', value)
        if w == window then
          count = n
        end
      elseif size == 24 then
        local w, n, h = struct.unpack('<ddd', value)
        if now < h then
          return fw_paused(w, n, h, now, cost, t, p)
        end
        if w == window then
          count = n
        end
      end
    end
    if cost > t - count then
      return 0, t, t - count, window_end_in, window_end_in
    end
    if commit then
      -- (A pause, if any, has ended: it is not written again.)
      count = count + cost
      local ms = 1
      if window_end_in > 1000 then
        ms = cdiv(window_end_in, 1000)
      end
      ms = ms + EXTRA_TTL_MS
      -- In a coalesced call, every key of a limit has this TTL: its text
      -- is made once (Redis 7.0's own conversion of a number costs about a
      -- sixteenth of the decision).
      local texts = MANY_NUMBERS
      if texts then
        local text = texts[ms]
        if text == nil then
          text = string.format('%d', ms)
          texts[ms] = text
        end
        ms = text
      end
      redis.call('SET', key, struct.pack('<dd', window, count), 'PX', ms)
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
    -- (a window that has ended is equivalent to no state); a pause stays.
    local w, n, h = fw_state(get_cached(r))
    if w ~= at_window or (at_window + 1) * r.p <= now then
      return
    end
    local count = math.max(n - r.cost, 0)
    if count == 0 and h <= now then
      redis.call('DEL', r.key)
    else
      fw_store(r, at_window, count, h, now)
    end
    return n > 0
  end

  -- Takes r.cost more in the current window whatever the limit says
  -- (debt, up to DEBT_CAP); a pause stays. ratewall Window::charge.
  function M.charge(r, now)
    local window = idiv(now, r.p)
    local w, n, h = fw_state(get_cached(r))
    local count = 0
    if w == window then
      count = n
    end
    fw_store(r, window, math.min(count + r.cost, DEBT_CAP), h, now)
  end

  -- A pause (r.cost = 0 units left, after > 0) refuses every call until
  -- now + after (after kept to DEBT_CAP); a count fills the current window
  -- so that at most r.cost units remain (after is not held with it).
  -- ratewall Window::hold.
  function M.hold(r, now, after)
    local left, t = r.cost, r.t
    if left >= t then
      return
    end
    local window = idiv(now, r.p)
    local w, n, h = fw_state(get_cached(r))
    local count = 0
    if w == window then
      count = n
    end
    if after > 0 and left == 0 then
      local held = now + math.min(after, DEBT_CAP)
      if held > h then
        fw_store(r, window, count, held, now)
      end
      return
    end
    if count >= t - left then
      return
    end
    fw_store(r, window, t - left, h, now)
  end

  return M
end
