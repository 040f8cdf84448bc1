-- Single-limit entry points: one request, one algorithm, decided with no
-- batch decoding and no first pass. Built once per algorithm module
-- (`single_decide(M, code, commit)`, `single_refund(M, code)`): in the
-- library at load time, in a script on each call.
--
-- keys: the state key `<key>:<algorithm>:<period>`.
-- args: only what the algorithm reads, each argument costing the server
-- about as much as a line of Lua: the limit's numbers (threshold, period,
-- then the burst for the buckets and GCRA, the slots for the sliding
-- window), the cost; a refund adds at (us) and its notice origin (empty:
-- tell nothing; see `tell` in prelude.lua); then, both optional, the time
-- ('s' or none: server TIME; else the client's now in us) and the extra
-- TTL (ms; none: 0).
--
-- Reply: allowed (1/0), limit, remaining, retry_after_us, reset_after_us,
-- then the now used (acquire, peek); the now alone (refund).

-- SINGLE_THIRD (generated, see script.rs): per algorithm code, the request
-- field its third limit number fills (the fixed window and the sliding log
-- take threshold and period only).

local function malformed_count(n)
  return redis.error_reply('ERR ratewall-redis: malformed arguments (' .. n .. ')')
end

local function malformed(args)
  return malformed_count(#args)
end

-- How many limit numbers `code` takes.
local function single_width(code)
  if SINGLE_THIRD[code] then
    return 3
  end
  return 2
end

-- The number a text reads as, converted once per coalesced call
-- (`numbers`: its conversions, MANY_NUMBERS).
local function single_number(numbers, text)
  local x = numbers[text]
  if x == nil then
    x = text + 0
    numbers[text] = x
  end
  return x
end

-- Fills `r` (a request table) from one call's keys and arguments (numbers
-- converted as below, in single_decide). A
-- library reuses one table per entry point (calls never overlap, and every
-- field is set again, the cached read cleared); a script makes one per
-- call.
local function single_request(r, third, keys, args)
  r.key = keys[1]
  r.t = args[1] + 0
  r.p = args[2] + 0
  if third then
    r[third] = args[3] + 0
    r.cost = args[4] + 0
  else
    r.cost = args[3] + 0
  end
  r.st = nil
  return r
end

-- Decides and commits (acquire) or only decides (peek).
--
-- The algorithms whose state is one string (fixed window, buckets, GCRA)
-- decide with their decide_at, straight from the arguments: no request
-- table. The hottest path, so written for the Lua VM: the clock is read
-- here, written out rather than through `clock` (a Lua call costs about
-- as much); the others, and refunds, call `clock`. Numbers are
-- converted from their text by arithmetic (`x + 0`, `time[1] * 1000000`):
-- `tonumber` is a global looked up, a C call, and converts its text twice,
-- together about as much as the whole GET.
local function single_decide(M, code, commit)
  local third = SINGLE_THIRD[code]
  local width = single_width(code)
  local at_cost, at_time, at_ttl = width + 1, width + 2, width + 3
  local decide_at = M.decide_at
  if decide_at then
    -- The call's arguments are args[a + 1 .. a + n] and its key keys[k + 1]:
    -- a coalesced call (many.lua) passes its own tables, read in place.
    -- The group of a coalesced call whose arguments were read last (its
    -- conversions, MANY_NUMBERS, made for that call only, and its place
    -- a, never 0 there) and what they read as: the calls of a group share
    -- their arguments, read once (about a thirtieth of the decision). A
    -- call with tables of its own (a = 0: alone, or not read in place)
    -- reads its own.
    local seen_numbers, seen_a = nil, nil
    local seen_t, seen_p, seen_cost, seen_b, seen_now, seen_ttl
    local function at(keys, k, args, a, n)
      local t, p, cost, b, now, ttl
      local numbers = MANY_NUMBERS
      if numbers and numbers == seen_numbers and a == seen_a then
        t, p, cost, b, now, ttl = seen_t, seen_p, seen_cost, seen_b, seen_now, seen_ttl
      else
        if n < at_cost or n > at_ttl then
          return malformed_count(n)
        end
        t, p, cost, b = args[a + 1], args[a + 2], args[a + at_cost], nil
        if third then
          b = args[a + 3]
        end
        if n >= at_time then
          now = args[a + at_time]
          if n == at_ttl then
            ttl = args[a + at_ttl]
          end
        end
        if numbers then
          -- A coalesced call's calls mostly share their limits: each text is
          -- converted once (converting a text costs about as much as a
          -- tenth of the decision).
          t, p, cost = single_number(numbers, t), single_number(numbers, p), single_number(numbers, cost)
          if b then
            b = single_number(numbers, b)
          end
          if ttl then
            ttl = single_number(numbers, ttl)
          end
        else
          t, p, cost = t + 0, p + 0, cost + 0
          if b then
            b = b + 0
          end
          if ttl then
            ttl = ttl + 0
          end
        end
        if now == nil or now == 's' then
          now = MANY_NOW
          if not now then
            local time = redis.call('TIME')
            now = time[1] * 1000000 + time[2]
          end
        else
          now = now + 0
        end
        if numbers and a ~= 0 then
          seen_numbers, seen_a = numbers, a
          seen_t, seen_p, seen_cost, seen_b, seen_now, seen_ttl = t, p, cost, b, now, ttl
        end
      end
      EXTRA_TTL_MS = ttl or 0
      local key = keys[k + 1]
      -- Read by the coalesced call's MGET, when it was: taken once (a later
      -- sub-call on the key reads what this one wrote).
      local value
      local got = MANY_GOT
      if got then
        value = got[key]
        got[key] = nil
      end
      if value == nil then
        value = redis.call('GET', key)
      end
      local allowed, limit, remaining, retry_after, reset_after = decide_at(
        key, value, now, cost, t, p, b, commit)
      if remaining < 0 then
        remaining = 0
      end
      return allowed, limit, remaining, retry_after, reset_after, now
    end
    return function(keys, args)
      local allowed, limit, remaining, retry_after, reset_after, now = at(keys, 0, args, 0, #args)
      if limit == nil then
        -- (An error reply.)
        return allowed
      end
      return { allowed, limit, remaining, retry_after, reset_after, now }
    end, at
  end
  local decide = M.decide
  local r = {}
  return function(keys, args)
    local n = #args
    if n < at_cost or n > at_ttl then
      return malformed(args)
    end
    local now = clock(args[at_time] or 's')
    EXTRA_TTL_MS = (args[at_ttl] or 0) + 0
    local allowed, limit, remaining, retry_after, reset_after = decide(single_request(r, third, keys, args), now, commit)
    if remaining < 0 then
      remaining = 0
    end
    return { allowed, limit, remaining, retry_after, reset_after, now }
  end
end

local function single_refund(M, code)
  local third = SINGLE_THIRD[code]
  local width = single_width(code)
  local at_at, at_origin, at_time, at_ttl = width + 2, width + 3, width + 4, width + 5
  local refund = M.refund
  local r = {}
  return function(keys, args)
    local n = #args
    if n < at_origin or n > at_ttl then
      return malformed(args)
    end
    local now = clock(args[at_time] or 's')
    EXTRA_TTL_MS = (args[at_ttl] or 0) + 0
    if refund(single_request(r, third, keys, args), now, args[at_at] + 0) then
      tell(args[at_origin], keys)
    end
    return { now }
  end
end
