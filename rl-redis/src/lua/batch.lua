-- Batch entry point: any number of requests, any mix of algorithms, every
-- operation. Used for multi-limit calls, idempotent calls and resets (a
-- single-limit acquire, peek or refund goes through single.lua).
--
-- args: op (acquire | acquire_once | peek | refund | refund_once | reset |
-- renew), time ('s' = server TIME, or the client's now in us), at (us,
-- refunds only), extra TTL (ms), then per request: algorithm code,
-- threshold, period (us), burst, slots, cost. For an in-flight limit
-- (code 'if') the slots field carries the slot's lease id (text).
-- keys: per request `<key>:<algorithm>:<period>`, plus `...:seq` for the
-- sliding log; the `_once` ops take one more, last key: the request-id key
-- `<first key>:req:<escaped id>`. All keys of one call share one hash tag.
--
-- Reply: per request allowed (1/0), limit, remaining, retry_after_us,
-- reset_after_us (acquire and peek only), then the now used. renew (of
-- in-flight slots only) answers per request 1 (renewed) or 0 (its lease
-- had expired), then the now used. acquire_once
-- appends two more integers: 1 if the reply is a replay (0 if decided now),
-- and the current now (a replay's decisions keep their original now).
--
-- acquire is all-or-nothing: every request is first evaluated without
-- writing; only if all are allowed is each committed, in order. The commit
-- pass reuses the first pass's reads (prelude.lua, `cached`), except for a
-- key that an earlier request of this call has used (the client refuses
-- a batch naming one state twice, rl-core Request::check_batch; the code
-- stays exact for one all the same).
-- acquire_once returns the reply kept under the request-id key if there is
-- one; otherwise it decides like acquire and, when allowed, keeps the reply
-- there for the longest period of the call. refund_once refunds and drops
-- the request-id key.

local BATCH_HEADER, BATCH_FIELDS = 4, 6

local function batch(keys, args)
  if #args < BATCH_HEADER or (#args - BATCH_HEADER) % BATCH_FIELDS ~= 0 then
    return redis.error_reply('ERR rl-redis: malformed arguments (' .. #args .. ')')
  end

  local op = args[1]
  local now = clock(args[2])
  local at = tonumber(args[3])
  EXTRA_TTL_MS = tonumber(args[4]) or 0

  local count = (#args - BATCH_HEADER) / BATCH_FIELDS
  local requests = {}
  local next_key = 1
  for i = 1, count do
    local a = BATCH_HEADER + (i - 1) * BATCH_FIELDS
    local r = {
      alg = args[a + 1],
      t = tonumber(args[a + 2]),
      p = tonumber(args[a + 3]),
      b = tonumber(args[a + 4]),
      slots = tonumber(args[a + 5]),
      cost = tonumber(args[a + 6]),
      key = keys[next_key],
    }
    if ALG[r.alg] == nil then
      local loader = LOADERS[r.alg]
      if loader == nil then
        return redis.error_reply('ERR rl-redis: unknown algorithm ' .. tostring(r.alg))
      end
      ALG[r.alg] = loader()
    end
    next_key = next_key + 1
    if r.alg == 'if' then
      r.lease = args[a + 5]
    end
    if r.alg == 'sl' then
      r.seq = keys[next_key]
      next_key = next_key + 1
    end
    requests[i] = r
  end
  local once = op == 'acquire_once' or op == 'refund_once'
  local id_key
  if once then
    id_key = keys[next_key]
    next_key = next_key + 1
  end
  if next_key - 1 ~= #keys then
    return redis.error_reply('ERR rl-redis: expected ' .. (next_key - 1) .. ' keys, got ' .. #keys)
  end

  -- Five values per request, at the request's place.
  local out = {}
  local function emit(i, allowed, limit, remaining, retry_after, reset_after)
    if remaining < 0 then
      remaining = 0
    end
    local o = (i - 1) * 5
    out[o + 1] = allowed
    out[o + 2] = limit
    out[o + 3] = remaining
    out[o + 4] = retry_after
    out[o + 5] = reset_after
    return allowed == 1
  end

  -- Decides the batch all-or-nothing and emits it; true when all allowed.
  local function acquire()
    local all = true
    if count > 1 then
      for i = 1, count do
        local r = requests[i]
        if not emit(i, ALG[r.alg].decide(r, now, false)) then
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
        if not emit(i, ALG[r.alg].decide(r, now, true)) then
          all = false
        end
      end
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
      emit(i, ALG[r.alg].decide(r, now, false))
    end
  elseif op == 'refund' or op == 'refund_once' then
    for i = 1, count do
      local r = requests[i]
      ALG[r.alg].refund(r, now, at)
    end
    if id_key then
      redis.call('DEL', id_key)
    end
  elseif op == 'renew' then
    for i = 1, count do
      local r = requests[i]
      local renew = ALG[r.alg].renew
      if renew then
        out[i] = renew(r, now)
      else
        out[i] = 0
      end
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
end

-- The read-only batch (FCALL_RO, a function flagged no-writes): peeks only.
local function batch_ro(keys, args)
  if args[1] ~= 'peek' then
    return redis.error_reply('ERR rl-redis: ' .. tostring(args[1]) .. ' is not read-only')
  end
  return batch(keys, args)
end
