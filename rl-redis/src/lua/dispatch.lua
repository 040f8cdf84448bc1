-- Dispatcher: decodes the batch and runs the operation.
--
-- ARGV: op (acquire | acquire_once | peek | refund | refund_once | reset),
-- time ('s' = server TIME, or the client's now in us), at (us, refunds
-- only), extra TTL (ms), then per request: algorithm code, threshold,
-- period (us), burst, slots, cost.
-- KEYS: per request `<key>:<algorithm>:<period>`, plus `...:seq` for the
-- sliding log; the `_once` ops take one more, last key: the request-id key
-- `<first key>:req:<escaped id>`. All keys of one call share one hash tag.
--
-- Reply: per request allowed (1/0), limit, remaining, retry_after_us,
-- reset_after_us (acquire and peek only), then the now used. acquire_once
-- appends two more integers: 1 if the reply is a replay (0 if decided now),
-- and the current now (a replay's decisions keep their original now).
--
-- acquire is all-or-nothing: every request is first evaluated without
-- writing; only if all are allowed is each committed, in order. The commit
-- pass reuses the first pass's reads (prelude.lua, `cached`), except for a
-- key that an earlier request of this call has used (the client refuses
-- a batch naming one state twice, rl-core Request::check_batch; the script
-- stays exact for one all the same).
-- acquire_once returns the reply kept under the request-id key if there is
-- one; otherwise it decides like acquire and, when allowed, keeps the reply
-- there for the longest period of the call. refund_once refunds and drops
-- the request-id key.

local HEADER, FIELDS = 4, 6
if #ARGV < HEADER or (#ARGV - HEADER) % FIELDS ~= 0 then
  return redis.error_reply('ERR rl-redis: malformed arguments (' .. #ARGV .. ')')
end

local op = ARGV[1]
local now
if ARGV[2] == 's' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[2])
end
local at = tonumber(ARGV[3])
EXTRA_TTL_MS = tonumber(ARGV[4]) or 0

local count = (#ARGV - HEADER) / FIELDS
local requests = {}
local next_key = 1
for i = 1, count do
  local a = HEADER + (i - 1) * FIELDS
  local r = {
    alg = ARGV[a + 1],
    t = tonumber(ARGV[a + 2]),
    p = tonumber(ARGV[a + 3]),
    b = tonumber(ARGV[a + 4]),
    slots = tonumber(ARGV[a + 5]),
    cost = tonumber(ARGV[a + 6]),
    key = KEYS[next_key],
  }
  if ALG[r.alg] == nil then
    local loader = LOADERS[r.alg]
    if loader == nil then
      return redis.error_reply('ERR rl-redis: unknown algorithm ' .. tostring(r.alg))
    end
    ALG[r.alg] = loader()
  end
  next_key = next_key + 1
  if r.alg == 'sl' then
    r.seq = KEYS[next_key]
    next_key = next_key + 1
  end
  requests[i] = r
end
local once = op == 'acquire_once' or op == 'refund_once'
local id_key
if once then
  id_key = KEYS[next_key]
  next_key = next_key + 1
end
if next_key - 1 ~= #KEYS then
  return redis.error_reply('ERR rl-redis: expected ' .. (next_key - 1) .. ' keys, got ' .. #KEYS)
end

local out = {}
local function emit(d)
  for j = 1, 5 do
    out[#out + 1] = d[j]
  end
end

-- Decides the batch all-or-nothing and emits it; true when all allowed.
local function acquire()
  local decided = {}
  local all = true
  if count > 1 then
    for i = 1, count do
      local r = requests[i]
      decided[i] = ALG[r.alg].decide(r, now, false)
      if decided[i][1] == 0 then
        all = false
      end
    end
  end
  if all then
    for i = 1, count do
      local r = requests[i]
      for j = 1, i - 1 do
        if requests[j].key == r.key then
          r.st = nil
        end
      end
      decided[i] = ALG[r.alg].decide(r, now, true)
      if decided[i][1] == 0 then
        all = false
      end
    end
  end
  for i = 1, count do
    emit(decided[i])
  end
  return all
end

if op == 'acquire' then
  acquire()
elseif op == 'acquire_once' then
  local kept = redis.call('GET', id_key)
  if kept then
    local values = {}
    for v in string.gmatch(kept, '[^,]+') do
      values[#values + 1] = tonumber(v)
    end
    if #values ~= count * 5 + 1 then
      return redis.error_reply('ERR rl-redis: request id reused for a call with ' .. count
        .. ' limit(s); it was first used with ' .. math.floor((#values - 1) / 5))
    end
    values[#values + 1] = 1
    values[#values + 1] = now
    return values
  end
  if acquire() then
    out[#out + 1] = now
    local parts = {}
    local longest = 0
    for i = 1, #out do
      parts[i] = fmt(out[i])
    end
    for i = 1, count do
      longest = math.max(longest, requests[i].p)
    end
    redis.call('SET', id_key, table.concat(parts, ','), 'PX',
      fmt(math.max(cdiv(longest, 1000), 1) + EXTRA_TTL_MS))
    out[#out + 1] = 0
    out[#out + 1] = now
    return out
  end
  out[#out + 1] = now
  out[#out + 1] = 0
  out[#out + 1] = now
  return out
elseif op == 'peek' then
  for i = 1, count do
    local r = requests[i]
    emit(ALG[r.alg].decide(r, now, false))
  end
elseif op == 'refund' or op == 'refund_once' then
  for i = 1, count do
    local r = requests[i]
    ALG[r.alg].refund(r, now, at)
  end
  if id_key then
    redis.call('DEL', id_key)
  end
elseif op == 'reset' then
  for i = 1, count do
    local r = requests[i]
    redis.call('DEL', r.key)
    if r.seq then
      redis.call('DEL', r.seq)
    end
  end
else
  return redis.error_reply('ERR rl-redis: unknown operation ' .. tostring(op))
end

out[#out + 1] = now
return out
