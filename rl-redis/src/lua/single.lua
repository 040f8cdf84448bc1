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

local function single_request(keys, args)
  return {
    key = keys[1],
    seq = keys[2],
    t = tonumber(args[3]),
    p = tonumber(args[4]),
    b = tonumber(args[5]),
    slots = tonumber(args[6]),
    cost = tonumber(args[7]),
  }
end

local function malformed(args)
  return redis.error_reply('ERR rl-redis: malformed arguments (' .. #args .. ')')
end

-- Decides and commits (acquire) or only decides (peek).
local function single_decide(M, commit)
  local decide = M.decide
  return function(keys, args)
    if #args ~= SINGLE_ARGS then
      return malformed(args)
    end
    local now = clock(args[1])
    EXTRA_TTL_MS = tonumber(args[2])
    local d = decide(single_request(keys, args), now, commit)
    d[6] = now
    return d
  end
end

local function single_refund(M)
  local refund = M.refund
  return function(keys, args)
    if #args ~= SINGLE_ARGS + 1 then
      return malformed(args)
    end
    local now = clock(args[1])
    EXTRA_TTL_MS = tonumber(args[2])
    refund(single_request(keys, args), now, tonumber(args[8]))
    return { now }
  end
end
