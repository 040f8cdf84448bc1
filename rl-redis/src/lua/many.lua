-- Coalesced calls (rl-redis/src/coalesce.rs): the independent calls of
-- several callers, queued on one connection while a call was in flight,
-- decided by one FCALL of <prefix>many (or <prefix>many_ro, no-writes, when
-- every one of them is read-only). As scripts too (CallMode::Scripts):
-- many_script.lua makes the entries they name on first use.
--
-- keys: every sub-call's keys, concatenated in order.
-- args: the count of groups, then per group (sub-calls next to each other
-- that call one entry with the same arguments, each with its own keys,
-- such as many callers of one limit): its entry (the name of the library
-- function it would have called alone, without the library's prefix:
-- 'gc_acquire', 'batch', 'batch_ro', ...), the key count of each of its
-- sub-calls, the argument count, the arguments, then how many sub-calls
-- it holds. (An argument costs the server about as much as a tenth of a
-- decision: the arguments of callers of one limit travel once.)
--
-- Each sub-call runs its entry exactly as the call alone would (its own
-- keys and arguments, all-or-nothing within it as alone), one after the
-- other, independent of the others, at one server time (read once, for
-- the sub-calls that ask the server's time): what it writes is what it
-- would have written alone, even when it fails (nothing is rolled back,
-- alone or here), and every key it writes gets its TTL from its own entry.
--
-- Reply: per sub-call, in order: what its entry returned (an array of
-- integers; a single acquire or peek's written out flat, not in an array
-- of their own: six integers, allowed (1/0), limit, remaining, retry
-- after, reset after and now, or fewer when its limit and now are those
-- of the last one written out in six: refused, three, -1 - remaining,
-- retry after and reset after; allowed with nothing to wait for, two,
-- remaining + 2 and reset after; each integer of a reply costs the server
-- about a sixtieth of a decision), or, when it returned or raised an
-- error, that error's line as a string ('<CODE> <message>': redis.call's
-- own error, e.g. WRONGTYPE, with its code; a Lua error under ERR). Not
-- an error reply inside the array: clients (redis-rs) fail the whole
-- reply for one. A malformed layout is refused before any sub-call runs.

-- The entries a coalesced call may name, filled by library.lua when it
-- registers them; MANY_READ_ONLY: those that never write.
local MANY_ENTRIES = {}
local MANY_READ_ONLY = {}
-- The entries that first GET their one key, a single state (the single
-- acquire and peek of the algorithms whose state is one string): read
-- together by MGETs (of at most MANY_MGET keys). Each names its form that reads its key and
-- arguments in place, from the coalesced call's own tables (single.lua).
local MANY_READS_ONE = {}

-- The line of the error a sub-call raised, as it comes back.
local function many_failure(e)
  if type(e) == 'table' and e.err then
    return tostring(e.err)
  end
  e = tostring(e)
  if string.find(e, '^[%u_]+ ') then
    return e
  end
  return 'ERR ' .. e
end

-- The most keys one MGET of a coalesced call reads.
local MANY_MGET = 1000

local function many_malformed()
  return redis.error_reply('ERR ratewall-redis: malformed coalesced call')
end

-- The layout starts after args[a0]; gather: whether the leading reads go
-- in MGETs (not on a cluster node: its keys may be of several slots).
local function run_many(keys, args, a0, entries, gather)
  local groups = tonumber(args[a0 + 1])
  if groups == nil or groups < 1 then
    return many_malformed()
  end
  -- First the layout, whole: a malformed call runs nothing. Each group's
  -- entry, counts and place are kept for the run. The keys the sub-calls
  -- read first, up to the first sub-call that writes another way, are
  -- noted for the MGETs.
  local fns, kcs, acs, places, sizes, in_place = {}, {}, {}, {}, {}, {}
  -- Texts converted to numbers, each once (single.lua reads it too).
  local numbers = {}
  local k, a = 0, a0 + 1
  local reads, reading = {}, gather
  for g = 1, groups do
    local name = args[a + 1]
    local entry = entries[name]
    local kc, ac = args[a + 2], args[a + 3]
    kc, ac = numbers[kc] or tonumber(kc), numbers[ac] or tonumber(ac)
    if entry == nil or kc == nil or ac == nil or kc < 0 or ac < 0 then
      return many_malformed()
    end
    numbers[args[a + 2]], numbers[args[a + 3]] = kc, ac
    local size = tonumber(args[a + 4 + ac])
    if size == nil or size < 1 or k + kc * size > #keys then
      return many_malformed()
    end
    local at = MANY_READS_ONE[name]
    if at and kc == 1 then
      fns[g] = at
      in_place[g] = true
      if reading then
        for j = 1, size do
          reads[#reads + 1] = keys[k + j]
        end
      end
    else
      fns[g] = entry
      reading = false
    end
    kcs[g], acs[g], places[g], sizes[g] = kc, ac, a + 3, size
    k = k + kc * size
    a = a + 4 + ac
  end
  if k ~= #keys or a ~= #args then
    return many_malformed()
  end
  -- One TIME for every sub-call that asks the server's time: they are
  -- decided at one moment, as one script's calls are anyway.
  local time = redis.call('TIME')
  MANY_NOW = time[1] * 1000000 + time[2]
  MANY_NUMBERS = numbers
  if gather and #reads > 1 then
    -- In MGETs of at most MANY_MGET keys: Lua unpacks no more than about
    -- 8 000 values at once, and a coalesced call has no bound of its own.
    local got = {}
    for from = 1, #reads, MANY_MGET do
      local to = math.min(from + MANY_MGET - 1, #reads)
      local values = redis.call('MGET', unpack(reads, from, to))
      for j = from, to do
        -- (No value: missing, or not a string, which the sub-call's own
        -- GET refuses as it would alone.)
        local value = values[j - from + 1]
        if value then
          got[reads[j]] = value
        end
      end
    end
    MANY_GOT = got
  end
  local out, m = {}, 0
  -- The limit and time of the last single acquire or peek written out in
  -- full.
  local last_limit, last_now = nil, nil
  k = 0
  for g = 1, groups do
    local fn, kc, ac, at, flat = fns[g], kcs[g], acs[g], places[g], in_place[g]
    for _ = 1, sizes[g] do
      local ok, reply
      if flat then
        -- Its integers go into the reply as they are, not in an array of
        -- their own (an array per call costs the server about as much as
        -- the decision).
        local allowed, limit, remaining, retry_after, reset_after, now
        ok, allowed, limit, remaining, retry_after, reset_after, now = pcall(fn, keys, k, args, at, ac)
        if ok and limit ~= nil then
          -- With the limit and time of the last one written out in full:
          -- allowed and remaining in the first integer of three, or of two
          -- when allowed (nothing to wait for).
          local same = limit == last_limit and now == last_now
          if same and allowed == 0 then
            out[m + 1], out[m + 2], out[m + 3] = -1 - remaining, retry_after, reset_after
            m = m + 3
          elseif same and retry_after == 0 then
            out[m + 1], out[m + 2] = remaining + 2, reset_after
            m = m + 2
          else
            out[m + 1], out[m + 2], out[m + 3] = allowed, limit, remaining
            out[m + 4], out[m + 5], out[m + 6] = retry_after, reset_after, now
            m = m + 6
            last_limit, last_now = limit, now
          end
          ok = nil
        else
          reply = allowed
        end
      else
        -- It may write a key a later sub-call reads: those read their own.
        MANY_GOT = nil
        local sub_keys, sub_args = {}, {}
        for j = 1, kc do
          sub_keys[j] = keys[k + j]
        end
        for j = 1, ac do
          sub_args[j] = args[at + j]
        end
        ok, reply = pcall(fn, sub_keys, sub_args)
      end
      k = k + kc
      if ok == nil then
        -- (Written above.)
      elseif ok and type(reply) == 'table' and reply.err then
        m = m + 1
        out[m] = tostring(reply.err)
      elseif ok then
        m = m + 1
        out[m] = reply
      else
        m = m + 1
        out[m] = many_failure(reply)
      end
    end
  end
  MANY_NOW = nil
  MANY_GOT = nil
  MANY_NUMBERS = nil
  return out
end

local function many(keys, args)
  return run_many(keys, args, 0, MANY_ENTRIES, true)
end

local function many_ro(keys, args)
  return run_many(keys, args, 0, MANY_READ_ONLY, true)
end

-- On a Redis Cluster node (rl-redis/src/coalesce.rs): the single-limit
-- acquires of callers whose keys are of any slots this node serves, with
-- no keys declared (the function is flagged allow-cross-slot-keys; its
-- script has no flags, which lets it do the same, many_script.lua). args:
-- the key count K, the keys, then the layout as above. A call whose key
-- is not served here (its slot moved, or is moving and the key is not
-- here) fails at its first read, before it wrote anything, with the
-- server's error ('... non local key ...'): its caller sends it alone,
-- which follows the cluster's redirections.
local MANY_NODE_ENTRIES = {}

local function many_node(_, args)
  local count = tonumber(args[1])
  if count == nil or count < 1 or count + 1 > #args then
    return many_malformed()
  end
  local keys = {}
  for j = 1, count do
    keys[j] = args[1 + j]
  end
  return run_many(keys, args, count + 1, MANY_NODE_ENTRIES, false)
end
