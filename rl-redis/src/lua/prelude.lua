-- ratewall-redis: the rate-limit algorithms, run atomically inside Redis.
--
-- Shared helpers. Every quantity is an integer (microseconds or units) kept
-- below 2^53, where Lua's doubles are exact; ratewall's Limit refuses limits
-- whose capacity x period would go beyond. Values are written with '%.0f'
-- only where they become text inside the script (a kept reply): numbers
-- passed to redis.call are formatted by Redis itself with '%.17g' (or as
-- integers, Redis >= 7.2), exact below 2^53, without a string.format call.
--
-- Layout of this file set (rl-redis/src/script.rs concatenates them):
-- prelude.lua, then the algorithms (fixed_window.lua, sliding_log.lua,
-- sliding_window.lua, meter.lua, gcra.lua, and in_flight.lua, the
-- concurrency limit, decided by the batch entry only), then the entry points
-- (single.lua: one limit, one algorithm; batch.lua: any batch; lease.lua:
-- quota leasing of rate limits), then either many.lua (the calls of
-- several callers in one FCALL) and library.lua (Redis >= 7: a Functions
-- library, loaded once, whose code above runs once at load time) or one
-- `return <entry>(KEYS, ARGV)` line (a script, for EVALSHA: the code above
-- runs on every call; the scripts of coalesced calls hold many.lua and
-- many_script.lua before it).

-- (A script starts with a line asking Redis 3.2 - 4.x for effects
-- replication, so that TIME is allowed before writes: script.rs.)

-- Top-level code here must not read globals such as `math`: a library's
-- top level runs at FUNCTION LOAD, where Redis only offers `redis`.
-- Functions read them when they run.

-- floor(a / b) for integers a >= 0, b > 0, corrected for the rounding of
-- the double quotient.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers a >= 0, b > 0, corrected likewise (written out
-- rather than through idiv: a Lua call costs about as much as the rest).
local function cdiv(a, b)
  local q = math.ceil(a / b)
  if q * b < a then
    q = q + 1
  elseif (q - 1) * b >= a then
    q = q - 1
  end
  return q
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- The most a charge (a settled cost's debt) leaves a state holding, in its
-- own measure: 2^52, where every integer stays exact in a double
-- (ratewall DEBT_CAP). A literal: a library's top level cannot call `math`.
local DEBT_CAP = 4503599627370496

-- Set by every entry point from its arguments: extra milliseconds added to
-- every TTL (0 by default).
local EXTRA_TTL_MS = 0

-- Milliseconds until `expires_at` (rounded up, at least 1), the TTL of a
-- state that is equivalent to no state from `expires_at` on.
local function ttl_ms(expires_at, now)
  local ms = 1
  if expires_at - now > 1000 then
    ms = cdiv(expires_at - now, 1000)
  end
  return ms + EXTRA_TTL_MS
end

local function expire(key, expires_at, now)
  redis.call('PEXPIRE', key, ttl_ms(expires_at, now))
end

-- The state read by `read(r, now)`, kept on the request: a multi-limit
-- acquire decides every request once without writing, then again to
-- commit, and the second pass reuses the first's read. batch.lua drops
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

-- The state of the algorithms whose state is one string: `cached` with
-- GET, written out (one Lua call fewer on every decision).
local function get_cached(r)
  local st = r.st
  if st == nil then
    st = redis.call('GET', r.key)
    r.st = st
  end
  return st
end

-- A module's decide(r, now, commit) returns five values (no table, no
-- call): allowed (1/0), limit, remaining (may be negative after a limit was
-- lowered: the entry points clamp it to 0), retry_after_us,
-- reset_after_us.

-- Per algorithm code, a loader returning its module: decide(r, now,
-- commit) -> the five values above; refund(r, now, at); charge(r, now)
-- (r.cost > 0 more units whatever the limit says: debt); hold(r, now,
-- after) (raise the state so that at most r.cost units remain `after` us
-- from now: an upstream's word). A script creates every function
-- it defines again on every call (about 0.1 us each here), so a script
-- creates each algorithm's functions only when a call uses it; a library
-- creates them all once, when it is loaded.
local LOADERS = {}

-- The modules loaded so far, by algorithm code (per call in a script, for
-- the library's lifetime in a library).
local ALG = {}

-- Refund notices (rl-redis/src/notices.rs): a call that gave room back
-- under a key (a refund, a call cancelled by its request id, a reset)
-- tells the other processes sharing the server, one PUBLISH per key on
-- `<prefix>:{refunds}` (classic pub/sub: a Redis Cluster carries it to
-- every node), the message being the caller's origin (16 hex digits:
-- which backend gave, so it can skip its own) then the key,
-- `prefix:{scope:identity}`. `state_keys` are the state keys given back
-- (`<key>:<algorithm>:<period>`: the key is everything up to their only
-- `}`, a prefix and the escaped scope and identity holding none); an
-- empty origin tells nothing. A channel is no key: nothing is stored.
local function tell(origin, state_keys)
  if origin == '' then
    return
  end
  local told = {}
  for i = 1, #state_keys do
    local key = string.match(state_keys[i], '^[^}]*}')
    if key and not told[key] then
      told[key] = true
      local prefix = string.match(key, '^([^{]*):{')
      if prefix then
        redis.call('PUBLISH', prefix .. ':{refunds}', origin .. key)
      end
    end
  end
end

-- The server's time (us) of the coalesced call running now (many.lua),
-- read once for all of its sub-calls; nil outside one.
local MANY_NOW = nil

-- The values of the coalesced call's single-state keys (many.lua), read
-- by MGETs for its sub-calls that GET one such key first (those that
-- hold a string), each taken at most once; nil outside one, and from the
-- first sub-call that may write another way.
local MANY_GOT = nil

-- The coalesced call's conversions (many.lua), each made once: its
-- sub-calls mostly share their limits' texts (keyed by the text: its
-- number) and the TTLs they write (keyed by the number: its text); nil
-- outside one.
local MANY_NUMBERS = nil

-- The time of a call from its `time` argument: 's' for the server's TIME
-- (the coalesced call's, inside one), else the client's time in us. (Text
-- becomes a number by arithmetic here and in the entry points: `tonumber`
-- costs a global look-up and a C call, and converts its text twice.)
local function clock(arg)
  if arg == 's' then
    if MANY_NOW then
      return MANY_NOW
    end
    local time = redis.call('TIME')
    return time[1] * 1000000 + time[2]
  end
  return arg + 0
end
