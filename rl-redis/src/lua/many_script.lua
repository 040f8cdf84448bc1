-- Coalesced calls as scripts (CallMode::Scripts, rl-redis/src/script.rs):
-- the `many`, `many_ro` and `many_node` entries of many.lua sent by
-- EVALSHA, one script each. The library registers every entry once, when
-- it is loaded (library.lua); a script runs all of its top level again on
-- every call, so here each entry a coalesced call names is made on its
-- first use in the call, from its algorithm's module (loaded once per
-- call, shared with the batch entries through ALG), and nothing else is.
--
-- The entries are those of the library's: for `many`, '<code>_acquire',
-- '<code>_peek', '<code>_refund' for each rate algorithm's code in CODES,
-- 'batch' and 'batch_ro'; for `many_ro`, the ones that never write
-- ('<code>_peek', 'batch_ro'); for `many_node`, '<code>_acquire'. A name
-- that is none of them is no entry, and the call is malformed (many.lua).
--
-- `many_node` on a Redis Cluster node declares no key, as the library's:
-- a script sent without flags (no `#!lua` line) may touch keys of any
-- slots its node serves (Redis 7 allows it to such scripts, as older
-- servers did), and one whose slot is served elsewhere fails at its first
-- read, before it wrote anything (many.lua).

local MANY_SCRIPT_CODES = {}
for i = 1, #CODES do
  MANY_SCRIPT_CODES[CODES[i]] = true
end

-- What each kind of coalesced call may run: 'all' (many), 'read'
-- (many_ro), 'node' (many_node); per kind, the single entries'
-- operations, and the batch entries.
local MANY_SCRIPT_OPS = {
  all = { acquire = true, peek = true, refund = true },
  read = { peek = true },
  node = { acquire = true },
}
local MANY_SCRIPT_BATCHES = {
  all = { batch = batch, batch_ro = batch_ro },
  read = { batch_ro = batch_ro },
  node = {},
}

-- The entry named `name` for a coalesced call of kind `kind`, made now;
-- nil when there is none.
local function many_script_entry(name, kind)
  if type(name) ~= 'string' then
    return nil
  end
  local whole = MANY_SCRIPT_BATCHES[kind][name]
  if whole then
    return whole
  end
  local code, op = string.match(name, '^(%w+)_(%l+)$')
  if not MANY_SCRIPT_CODES[code] or not MANY_SCRIPT_OPS[kind][op] then
    return nil
  end
  local M = ALG[code]
  if M == nil then
    M = LOADERS[code]()
    ALG[code] = M
  end
  if op == 'refund' then
    return single_refund(M, code)
  end
  local entry, entry_at = single_decide(M, code, op == 'acquire')
  MANY_READS_ONE[name] = entry_at
  return entry
end

local function many_script_entries(entries, kind)
  setmetatable(entries, {
    __index = function(made, name)
      local entry = many_script_entry(name, kind)
      if entry then
        rawset(made, name, entry)
      end
      return entry
    end,
  })
end

many_script_entries(MANY_ENTRIES, 'all')
many_script_entries(MANY_READ_ONLY, 'read')
many_script_entries(MANY_NODE_ENTRIES, 'node')
