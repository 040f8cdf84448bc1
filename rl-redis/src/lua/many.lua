-- Coalesced calls (rl-redis/src/coalesce.rs): the independent calls of
-- several callers, queued on one connection while a call was in flight,
-- decided by one FCALL of <prefix>many (or <prefix>many_ro, no-writes, when
-- every one of them is read-only). Library only: scripts go alone.
--
-- keys: every sub-call's keys, concatenated in order.
-- args: the count n, then per sub-call: its entry (the name of the
-- library function it would have called alone, without the library's
-- prefix: 'gc_acquire', 'batch', 'batch_ro', ...), its key count, its
-- argument count, then its arguments.
--
-- Each sub-call runs its entry exactly as the call alone would (its own
-- keys and arguments, all-or-nothing within it as alone), one after the
-- other, independent of the others, at one server time (read once, for
-- the sub-calls that ask the server's time): what it writes is what it
-- would have written alone, even when it fails (nothing is rolled back,
-- alone or here), and every key it writes gets its TTL from its own entry.
--
-- Reply: one reply per sub-call, in order: what its entry returned (an
-- array of integers), or, when it returned or raised an error, that
-- error's line as a string ('<CODE> <message>': redis.call's own error,
-- e.g. WRONGTYPE, with its code; a Lua error under ERR). Not an error
-- reply inside the array: clients (redis-rs) fail the whole reply for one.
-- A malformed layout is refused before any sub-call runs.

-- The entries a coalesced call may name, filled by library.lua when it
-- registers them; MANY_READ_ONLY: those that never write.
local MANY_ENTRIES = {}
local MANY_READ_ONLY = {}
-- The entries that first GET their one key, a single state (the single
-- acquire and peek of fixed window and GCRA): read together by one MGET.
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

local function many_malformed()
  return redis.error_reply('ERR ratewall-redis: malformed coalesced call')
end

local function run_many(keys, args, entries)
  local n = tonumber(args[1])
  if n == nil or n < 1 then
    return many_malformed()
  end
  -- First the layout, whole: a malformed call runs nothing. The keys the
  -- sub-calls read first, up to the first sub-call that writes another
  -- way, are noted for one MGET.
  local k, a = 0, 1
  local reads, reading = {}, true
  for _ = 1, n do
    local name = args[a + 1]
    local kc, ac = tonumber(args[a + 2]), tonumber(args[a + 3])
    if entries[name] == nil or kc == nil or ac == nil or kc < 0 or ac < 0 then
      return many_malformed()
    end
    if reading then
      if MANY_READS_ONE[name] and kc == 1 then
        reads[#reads + 1] = keys[k + 1]
      else
        reading = false
      end
    end
    k = k + kc
    a = a + 3 + ac
  end
  if k ~= #keys or a ~= #args then
    return many_malformed()
  end
  -- One TIME for every sub-call that asks the server's time: they are
  -- decided at one moment, as one script's calls are anyway.
  local time = redis.call('TIME')
  MANY_NOW = time[1] * 1000000 + time[2]
  if #reads > 1 then
    local values = redis.call('MGET', unpack(reads))
    local got = {}
    for j = 1, #reads do
      -- (No value: missing, or not a string, which the sub-call's own
      -- GET refuses as it would alone.)
      if values[j] then
        got[reads[j]] = values[j]
      end
    end
    MANY_GOT = got
  end
  local out = {}
  k, a = 0, 1
  for i = 1, n do
    local name = args[a + 1]
    local entry = entries[name]
    local kc, ac = args[a + 2] + 0, args[a + 3] + 0
    if MANY_GOT and not MANY_READS_ONE[name] then
      -- It may write a key a later sub-call reads: those read their own.
      MANY_GOT = nil
    end
    local sub_keys, sub_args = {}, {}
    for j = 1, kc do
      sub_keys[j] = keys[k + j]
    end
    for j = 1, ac do
      sub_args[j] = args[a + 3 + j]
    end
    k = k + kc
    a = a + 3 + ac
    local ok, reply = pcall(entry, sub_keys, sub_args)
    if ok and type(reply) == 'table' and reply.err then
      out[i] = tostring(reply.err)
    elseif ok then
      out[i] = reply
    else
      out[i] = many_failure(reply)
    end
  end
  MANY_NOW = nil
  MANY_GOT = nil
  return out
end

local function many(keys, args)
  return run_many(keys, args, MANY_ENTRIES)
end

local function many_ro(keys, args)
  return run_many(keys, args, MANY_READ_ONLY)
end
