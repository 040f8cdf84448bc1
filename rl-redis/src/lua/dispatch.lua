-- Dispatcher: decodes the batch and runs the operation.
--
-- ARGV: op (acquire | peek | refund | reset), time ('s' = server TIME, or
-- the client's now in us), at (us, refund only), extra TTL (ms), then per
-- request: algorithm code, threshold, period (us), burst, slots, cost.
-- KEYS: per request `<key>:<algorithm>:<period>`, plus `...:seq` for the
-- sliding log. All keys of one call share one hash tag.
--
-- Reply: per request allowed (1/0), limit, remaining, retry_after_us,
-- reset_after_us (acquire and peek only), then the now used.
--
-- acquire is all-or-nothing: every request is first evaluated without
-- writing; only if all are allowed is each committed, in order.

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
    return redis.error_reply('ERR rl-redis: unknown algorithm ' .. tostring(r.alg))
  end
  next_key = next_key + 1
  if r.alg == 'sl' then
    r.seq = KEYS[next_key]
    next_key = next_key + 1
  end
  requests[i] = r
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

if op == 'acquire' then
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
      decided[i] = ALG[r.alg].decide(r, now, true)
    end
  end
  for i = 1, count do
    emit(decided[i])
  end
elseif op == 'peek' then
  for i = 1, count do
    local r = requests[i]
    emit(ALG[r.alg].decide(r, now, false))
  end
elseif op == 'refund' then
  for i = 1, count do
    local r = requests[i]
    ALG[r.alg].refund(r, now, at)
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
