-- The Redis Functions library (Redis >= 7): everything above runs once,
-- at FUNCTION LOAD; a call runs only its entry point. rl-redis/src/script.rs
-- puts `#!lua name=<library>` and `local RL_PREFIX = '<library>_'` first:
-- the names carry a hash of the code, so two versions of ratewall-redis can share
-- a server.
--
-- Per algorithm code (fw, sl, sw, tb, lb, gc): <prefix><code>_acquire,
-- <prefix><code>_peek (no-writes: FCALL_RO), <prefix><code>_refund
-- (single.lua); <prefix>batch, <prefix>batch_ro (no-writes: peeks, and
-- the blocks of an identity)
-- for everything else (batch.lua), in-flight limits (code 'if') included:
-- their module is loaded by the batch on first use; <prefix>lease for
-- quota leasing of rate limits (lease.lua); <prefix>many and
-- <prefix>many_ro (no-writes) for the calls of several callers coalesced
-- into one (many.lua), which name the entries above, and <prefix>many_node
-- (allow-cross-slot-keys) for the acquires coalesced on a cluster node.

-- An entry called on its own: no coalesced call's time, read values or
-- converted numbers apply (one that was interrupted, killed or out of memory may have left
-- them set).
local function alone(entry)
  return function(keys, args)
    MANY_NOW = nil
    MANY_GOT = nil
    MANY_NUMBERS = nil
    return entry(keys, args)
  end
end

-- (No `pairs` here: at load time Redis offers no global but `redis`.)
-- CODES: the rate algorithms' codes (generated, see script.rs).
for i = 1, #CODES do
  local code = CODES[i]
  local M = LOADERS[code]()
  ALG[code] = M
  local acquire, acquire_at = single_decide(M, code, true)
  local peek, peek_at = single_decide(M, code, false)
  local refund = single_refund(M, code)
  redis.register_function(RL_PREFIX .. code .. '_acquire', alone(acquire))
  redis.register_function{
    function_name = RL_PREFIX .. code .. '_peek',
    callback = alone(peek),
    flags = { 'no-writes' },
  }
  redis.register_function(RL_PREFIX .. code .. '_refund', alone(refund))
  MANY_ENTRIES[code .. '_acquire'] = acquire
  MANY_ENTRIES[code .. '_peek'] = peek
  MANY_ENTRIES[code .. '_refund'] = refund
  MANY_READ_ONLY[code .. '_peek'] = peek
  MANY_NODE_ENTRIES[code .. '_acquire'] = acquire
  if acquire_at then
    MANY_READS_ONE[code .. '_acquire'] = acquire_at
    MANY_READS_ONE[code .. '_peek'] = peek_at
  end
end
redis.register_function(RL_PREFIX .. 'batch', alone(batch))
redis.register_function{
  function_name = RL_PREFIX .. 'batch_ro',
  callback = alone(batch_ro),
  flags = { 'no-writes' },
}
redis.register_function(RL_PREFIX .. 'lease', alone(lease))
MANY_ENTRIES['batch'] = batch
MANY_ENTRIES['batch_ro'] = batch_ro
MANY_READ_ONLY['batch_ro'] = batch_ro
redis.register_function(RL_PREFIX .. 'many', many)
redis.register_function{
  function_name = RL_PREFIX .. 'many_ro',
  callback = many_ro,
  flags = { 'no-writes' },
}
redis.register_function{
  function_name = RL_PREFIX .. 'many_node',
  callback = many_node,
  flags = { 'allow-cross-slot-keys' },
}
