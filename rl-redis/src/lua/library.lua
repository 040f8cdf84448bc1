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
-- quota leasing of rate limits (lease.lua).

-- (No `pairs` here: at load time Redis offers no global but `redis`.)
-- CODES: the rate algorithms' codes (generated, see script.rs).
for i = 1, #CODES do
  local code = CODES[i]
  local M = LOADERS[code]()
  ALG[code] = M
  redis.register_function(RL_PREFIX .. code .. '_acquire', single_decide(M, code, true))
  redis.register_function{
    function_name = RL_PREFIX .. code .. '_peek',
    callback = single_decide(M, code, false),
    flags = { 'no-writes' },
  }
  redis.register_function(RL_PREFIX .. code .. '_refund', single_refund(M, code))
end
redis.register_function(RL_PREFIX .. 'batch', batch)
redis.register_function{
  function_name = RL_PREFIX .. 'batch_ro',
  callback = batch_ro,
  flags = { 'no-writes' },
}
redis.register_function(RL_PREFIX .. 'lease', lease)
