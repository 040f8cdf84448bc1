-- Fixed window (rl-core algorithm/fixed_window.rs).
-- State: HASH { w = window index, n = count in that window }.
-- Expires at the window's end: (w + 1) * P.
LOADERS.fw = function()
  local M = {}

  local function fw_count(r, window)
    local st = redis.call('HMGET', r.key, 'w', 'n')
    if st[1] and tonumber(st[1]) == window then
      return tonumber(st[2]) or 0
    end
    return 0
  end

  function M.decide(r, now, commit)
    local t, p = r.t, r.p
    local window = idiv(now, p)
    local window_end_in = p - (now - window * p)
    local count = fw_count(r, window)
    if r.cost > t - count then
      return decision(false, t, t - count, window_end_in, window_end_in)
    end
    if commit then
      count = count + r.cost
      redis.call('HSET', r.key, 'w', fmt(window), 'n', fmt(count))
      expire(r.key, (window + 1) * p, now)
    end
    local reset = 0
    if count > 0 then
      reset = window_end_in
    end
    return decision(true, t, t - count, 0, reset)
  end

  function M.refund(r, now, at)
    local p = r.p
    local at_window = idiv(at, p)
    local st = redis.call('HMGET', r.key, 'w', 'n')
    -- Only the window the decision was made in, and only while it lasts
    -- (a window that has ended is equivalent to no state).
    if not st[1] or tonumber(st[1]) ~= at_window or (at_window + 1) * p <= now then
      return
    end
    local count = (tonumber(st[2]) or 0) - r.cost
    if count <= 0 then
      redis.call('DEL', r.key)
    else
      redis.call('HSET', r.key, 'n', fmt(count))
      expire(r.key, (at_window + 1) * p, now)
    end
  end

  return M
end
