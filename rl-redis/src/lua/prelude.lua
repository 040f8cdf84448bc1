-- rl-redis: one script decides a batch of rate-limit requests atomically.
--
-- Shared helpers. Every quantity is an integer (microseconds or units) kept
-- below 2^53, where Lua's doubles are exact; rl-core's Limit refuses limits
-- whose capacity x period would go beyond. Values are written with '%.0f'
-- only where they become text inside the script (a kept reply): numbers
-- passed to redis.call are formatted by Redis itself with '%.17g' (or as
-- integers, Redis >= 7.2), exact below 2^53, without a string.format call.
--
-- Layout of this file set (concatenated in this order into ONE script):
-- prelude.lua, fixed_window.lua, sliding_log.lua, sliding_window.lua,
-- meter.lua, gcra.lua, dispatch.lua.

-- Redis 3.2 - 4.x: replicate effects, not the script, so TIME is allowed
-- before writes. Redis >= 5 always does; from 7.0 on (which announces
-- itself with REDIS_VERSION) the call is skipped, as it costs about a
-- tenth of a decision there.
if redis.replicate_commands and not redis.REDIS_VERSION then
  redis.replicate_commands()
end

local floor = math.floor

-- floor(a / b) for integers a >= 0, b > 0, corrected for the rounding of
-- the double quotient.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers a >= 0, b > 0.
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- Set by dispatch.lua: extra milliseconds added to every TTL (0 by default).
local EXTRA_TTL_MS = 0

-- Milliseconds until `expires_at` (rounded up, at least 1), the TTL of a
-- state that is equivalent to no state from `expires_at` on.
local function ttl_ms(expires_at, now)
  local ms = cdiv(math.max(expires_at - now, 0), 1000)
  if ms < 1 then
    ms = 1
  end
  return ms + EXTRA_TTL_MS
end

local function expire(key, expires_at, now)
  redis.call('PEXPIRE', key, ttl_ms(expires_at, now))
end

-- The state read by `read(r, now)`, kept on the request: a multi-limit
-- acquire decides every request once without writing, then again to
-- commit, and the second pass reuses the first's read. dispatch.lua drops
-- it for a key that an earlier request of the same call has used. (`false`,
-- a missing key, is a value too.)
local function cached(r, read, now)
  local st = r.st
  if st == nil then
    st = read(r, now)
    r.st = st
  end
  return st
end

-- The read of the algorithms whose state is one string.
local function get(r)
  return redis.call('GET', r.key)
end

-- A decision: allowed (1/0), limit, remaining, retry_after_us, reset_after_us.
local function decision(allowed, limit, remaining, retry_after, reset_after)
  return { allowed and 1 or 0, limit, math.max(remaining, 0), retry_after, reset_after }
end

-- Per algorithm code, a loader returning its module: decide(r, now,
-- commit) -> decision; refund(r, now, at). Every function a script defines
-- is created again on every call (about 0.1 us each here), so each
-- algorithm's functions are created only when a call uses it.
local LOADERS = {}

-- The modules loaded by this call, by algorithm code.
local ALG = {}
