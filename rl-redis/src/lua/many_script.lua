-- Coalesced calls as scripts (CallMode::Scripts, rl-redis/src/script.rs):
-- the `many` and `many_ro` entries of many.lua sent by EVALSHA, on one
-- server only (a script may not touch keys of several Redis Cluster
-- slots). The library registers every entry once, when it is loaded
-- (library.lua); a script runs all of its top level again on every call,
-- so here each entry a coalesced call names is made on its first use in
-- the call, from its algorithm's module (loaded once per call, shared
-- with the batch entries through ALG), and nothing else is.
--
-- The entries are those of the library's `many` (`many_ro`: the ones that
-- never write): '<code>_acquire', '<code>_peek', '<code>_refund' for each
-- rate algorithm's code in CODES, 'batch' and 'batch_ro'. A name that is
-- none of them is no entry, and the call is malformed (many.lua).

local MANY_SCRIPT_CODES = {}
for i = 1, #CODES do
  MANY_SCRIPT_CODES[CODES[i]] = true
end

-- The entry named `name`, made now; nil when there is none (or it writes,
-- and `read_only` asks for one that does not).
local function many_script_entry(name, read_only)
  if type(name) ~= 'string' then
    return nil
  elseif name == 'batch_ro' then
    return batch_ro
  elseif name == 'batch' then
    return (not read_only) and batch or nil
  end
  local code, op = string.match(name, '^(%l+)_(%l+)$')
  if not MANY_SCRIPT_CODES[code] then
    return nil
  end
  local M = ALG[code]
  if M == nil then
    M = LOADERS[code]()
    ALG[code] = M
  end
  if op == 'peek' or (op == 'acquire' and not read_only) then
    local entry, entry_at = single_decide(M, code, op == 'acquire')
    MANY_READS_ONE[name] = entry_at
    return entry
  elseif op == 'refund' and not read_only then
    return single_refund(M, code)
  end
  return nil
end

local function many_script_entries(entries, read_only)
  setmetatable(entries, {
    __index = function(made, name)
      local entry = many_script_entry(name, read_only)
      if entry then
        rawset(made, name, entry)
      end
      return entry
    end,
  })
end

many_script_entries(MANY_ENTRIES, false)
many_script_entries(MANY_READ_ONLY, true)
