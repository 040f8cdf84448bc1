-- In flight (rl-core/src/algorithm/in_flight.rs): at most t slots held at once;
-- p is a slot's lease (us). Not a rate: a slot is taken by an admission and
-- given back (refund) when its call ends.
-- State: a sorted set, one member per held slot, named by the admission's
-- lease id (16 hex digits, the request's `lease`), scored by the time its
-- lease expires (us). A member whose lease expired counts for nothing (its
-- holder stopped renewing it: it died) and is removed when a slot is taken.
-- Every write gives the key a TTL of a full lease, which covers every
-- member's expiry (all are at most now + p).
-- Figures: remaining = t - held; a refusal's retry_after is a hint (1 s: a
-- slot frees whenever a call ends); reset_after = p while a slot is held.
LOADERS['if'] = function()
  local M = {}
  local RETRY_HINT_US = 1000000

  -- The live slots, read once per request (kept in r.st).
  local function held(r, now)
    local n = r.st
    if n == nil then
      n = redis.call('ZCOUNT', r.key, '(' .. fmt(now), '+inf')
      r.st = n
    end
    return n
  end

  function M.decide(r, now, commit)
    local t, p, c = r.t, r.p, r.cost
    local n = held(r, now)
    if n + c > t then
      return 0, t, t - n, RETRY_HINT_US, p
    end
    if commit then
      redis.call('ZREMRANGEBYSCORE', r.key, '-inf', now)
      redis.call('ZADD', r.key, now + p, r.lease)
      expire(r.key, now + p, now)
      n = n + c
      r.st = n
    end
    local reset_after = 0
    if n > 0 then
      reset_after = p
    end
    return 1, t, t - n, 0, reset_after
  end

  -- (A slot given back is not told to other processes: no one remembers
  -- a concurrency refusal, and no call waits for a slot.)
  function M.refund(r, now, at)
    redis.call('ZREM', r.key, r.lease)
  end

  -- A full lease again from now for a slot still held: 1; 0 when its lease
  -- had expired (it is not taken again: another call may have its place).
  function M.renew(r, now)
    local score = redis.call('ZSCORE', r.key, r.lease)
    if not score or tonumber(score) <= now then
      return 0
    end
    redis.call('ZADD', r.key, 'XX', now + r.p, r.lease)
    expire(r.key, now + r.p, now)
    return 1
  end

  return M
end
