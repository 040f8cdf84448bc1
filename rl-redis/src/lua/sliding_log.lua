-- Sliding log (rl-core/src/algorithm/sliding_log.rs).
-- State: one ZSET, score = admission time (us), one entry per admitted
-- unit. The k-th entry a call adds at time `now` is named by the number
-- (now mod 2^25) * 64 + k: below 2^31, so 5 bytes in the set's compact
-- encoding (the time itself would take 9), and distinct for every time
-- within 2^25 us (33.6 s) and the first 64 entries of each. ZADD NX skips
-- a name the set already holds (an entry of a time 33.6 s apart, or of
-- one microsecond taken twice), so no entry ever overwrites another.
-- Entries with score + P <= now are gone; every other entry counts, one
-- later than now included. A pause until `until` is written as entries
-- leaving then: those leaving before `until` go, then min(T, 2T - k) at
-- until - P join the k left (ratewall Log::hold). The key expires when the
-- newest entry leaves the window.
--
-- Peeks and refused calls write nothing: stale entries are skipped by rank
-- (ZCOUNT) instead of being removed; an admitted call trims them.
LOADERS.sl = function()
  local M = {}

  -- Adds `c` entries with score `now`, named as above: the names are tried
  -- in order, ZADD NX skips those the set holds, until `c` are in (bounded:
  -- each name skipped is an entry the set holds). At most 64 entries per
  -- ZADD, so no more than 129 values are ever unpacked.
  local function sl_add(r, now, c)
    local name = (now % 33554432) * 64
    while c > 0 do
      local args = { 'NX' }
      for _ = 1, math.min(c, 64) do
        args[#args + 1] = now
        args[#args + 1] = name
        name = name + 1
      end
      c = c - redis.call('ZADD', r.key, unpack(args))
    end
  end

  -- { entries, stale entries (score <= now - P), newest score or false }.
  local function sl_read(r, now)
    local st = { redis.call('ZCARD', r.key), 0, false }
    if st[1] > 0 then
      st[2] = redis.call('ZCOUNT', r.key, '-inf', now - r.p)
      st[3] = tonumber(redis.call('ZRANGE', r.key, -1, -1, 'WITHSCORES')[2]) or false
    end
    return st
  end

  function M.decide(r, now, commit)
    local t, p, c = r.t, r.p, r.cost
    local cutoff = now - p
    local st = cached(r, sl_read, now)
    local total, stale, newest = st[1], st[2], st[3] or nil
    local n = total - stale
    if c > t - n then
      -- The k-th oldest live entry is the one whose leaving makes room for c.
      local k = n + c - t
      local entry = redis.call('ZRANGE', r.key, stale + k - 1, stale + k - 1, 'WITHSCORES')
      local retry = p
      if entry[2] then
        retry = tonumber(entry[2]) + p - now
      end
      return 0, t, t - n, retry, newest + p - now
    end
    if commit then
      if stale > 0 then
        redis.call('ZREMRANGEBYSCORE', r.key, '-inf', cutoff)
      end
      sl_add(r, now, c)
      n = n + c
      if newest == nil or now > newest then
        newest = now
      end
      expire(r.key, newest + p, now)
    end
    local reset = 0
    if n > 0 then
      reset = newest + p - now
    end
    return 1, t, t - n, 0, reset
  end

  function M.refund(r, now, at)
    local p = r.p
    local ids = redis.call('ZRANGEBYSCORE', r.key, at, at, 'LIMIT', 0, r.cost)
    if #ids == 0 then
      return
    end
    for i = 1, #ids do
      redis.call('ZREM', r.key, ids[i])
    end
    redis.call('ZREMRANGEBYSCORE', r.key, '-inf', now - p)
    local newest = tonumber(redis.call('ZRANGE', r.key, -1, -1, 'WITHSCORES')[2])
    if newest == nil then
      redis.call('DEL', r.key)
    else
      expire(r.key, newest + p, now)
    end
    return true
  end

  -- Adds r.cost entries at `now` whatever the limit says, at most T at one
  -- time (entries of one time leave together: more could refuse nothing
  -- more) and at most 2T live in all. ratewall Log::charge.
  function M.charge(r, now)
    local p = r.p
    redis.call('ZREMRANGEBYSCORE', r.key, '-inf', now - p)
    local live = redis.call('ZCARD', r.key)
    local add = math.min(r.cost, r.t - redis.call('ZCOUNT', r.key, now, now), 2 * r.t - live)
    if add <= 0 then
      return
    end
    sl_add(r, now, add)
    local newest = math.max(tonumber(redis.call('ZRANGE', r.key, -1, -1, 'WITHSCORES')[2]) or now, now)
    expire(r.key, newest + p, now)
  end

  -- A pause (r.cost = 0 units left, after > 0) until `until` = now + after
  -- (after kept to DEBT_CAP): the entries leaving before it go (the pause
  -- refuses everything they could), then min(T, 2T - k) entries at
  -- until - P (at 0 if negative) join the k left, so that T count until
  -- `until` even once calls among the k are refunded. A count adds entries
  -- at `now` until at most r.cost units remain (after is not held with
  -- it). ratewall Log::hold.
  function M.hold(r, now, after)
    local t, p, left = r.t, r.p, r.cost
    if left >= t then
      return
    end
    redis.call('ZREMRANGEBYSCORE', r.key, '-inf', now - p)
    local at, add = now, 0
    if after > 0 and left == 0 then
      at = math.max(now + math.min(after, DEBT_CAP) - p, 0)
      redis.call('ZREMRANGEBYSCORE', r.key, '-inf', '(' .. fmt(at))
      add = math.min(t, 2 * t - redis.call('ZCARD', r.key))
    else
      add = t - left - redis.call('ZCARD', r.key)
    end
    if add <= 0 then
      return
    end
    sl_add(r, at, add)
    local newest = math.max(tonumber(redis.call('ZRANGE', r.key, -1, -1, 'WITHSCORES')[2]) or at, at)
    expire(r.key, newest + p, now)
  end

  return M
end
