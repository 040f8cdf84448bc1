-- Single-limit entry points: one request, one algorithm, decided with no
-- batch decoding and no first pass. Built once per algorithm module
-- (`single_acquire(M)` etc.): in the library at load time, in a script on
-- each call.
--
-- keys: the state key `<key>:<algorithm>:<period>` (plus `...:seq` for the
-- sliding log).
-- args: time ('s' = server TIME, or the client's now in us), extra TTL
-- (ms), threshold, period (us), burst, slots, cost; a refund adds at (us).
--
-- Reply: allowed (1/0), limit, remaining, retry_after_us, reset_after_us,
-- then the now used (acquire, peek); the now alone (refund).

local SINGLE_ARGS = 7

-- Fills `r` (a request table) from one call's keys and arguments. A
-- library reuses one table per entry point (calls never overlap, and every
-- field is set again, the cached read cleared); a script makes one per
-- call.
local function single_request(r, keys, args)
  r.key = keys[1]
  r.seq = keys[2]
  r.t = tonumber(args[3])
  r.p = tonumber(args[4])
  r.b = tonumber(args[5])
  r.slots = tonumber(args[6])
  r.cost = tonumber(args[7])
  r.st = nil
  return r
end

local function malformed(args)
  return redis.error_reply('ERR rl-redis: malformed arguments (' .. #args .. ')')
end

-- Decides and commits (acquire) or only decides (peek).
-- (The hottest path: the request is filled and the clock read here,
-- written out, as a Lua call costs about as much as either.)
local function single_decide(M, commit)
  local decide = M.decide
  local r = {}
  return function(keys, args)
    if #args ~= SINGLE_ARGS then
      return malformed(args)
    end
    local now
    if args[1] == 's' then
      local time = redis.call('TIME')
      now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    else
      now = tonumber(args[1])
    end
    EXTRA_TTL_MS = tonumber(args[2])
    r.key = keys[1]
    r.seq = keys[2]
    r.t = tonumber(args[3])
    r.p = tonumber(args[4])
    r.b = tonumber(args[5])
    r.slots = tonumber(args[6])
    r.cost = tonumber(args[7])
    r.st = nil
    local allowed, limit, remaining, retry_after, reset_after = decide(r, now, commit)
    if remaining < 0 then
      remaining = 0
    end
    return { allowed, limit, remaining, retry_after, reset_after, now }
  end
end

local function single_refund(M)
  local refund = M.refund
  local r = {}
  return function(keys, args)
    if #args ~= SINGLE_ARGS + 1 then
      return malformed(args)
    end
    local now = clock(args[1])
    EXTRA_TTL_MS = tonumber(args[2])
    refund(single_request(r, keys, args), now, tonumber(args[8]))
    return { now }
  end
end
