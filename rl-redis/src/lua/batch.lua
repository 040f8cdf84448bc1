-- Batch entry point: any number of requests, any mix of algorithms, every
-- operation. Used for multi-limit calls, idempotent calls and resets (a
-- single-limit acquire, peek or refund goes through single.lua).
--
-- args: op (acquire | acquire_once | peek | probe | refund | refund_once |
-- cancel_once | charge | hold | reset | reserve | cancel | renew | blocks |
-- unblock), time ('s' = server TIME, or the client's now
-- in us), at (us: a refund's time, a hold's delay, a peek's time ahead of now, a
-- reserve's longest wait, a cancel's slot), extra TTL (ms), then per request: algorithm code, threshold, period
-- (us), burst, slots, cost, then reserve and cancel add two fields per request
-- (reserve: the earliest slot allowed, 0 for none, and 0; cancel: 1 if the
-- limit took a given-back slot, and the mark its decision left), and last
-- the block (us, 0: none; block.lua). For an
-- in-flight limit (code 'if') the slots field carries the slot's lease id
-- (text); reserve and cancel never carry one (a waiting call cannot hold
-- in-flight slots), nor a block. refund, cancel_once, reset and unblock
-- end with one more argument: their notice origin (TOLD; empty: tell
-- nothing): each key that got something back (a reset: its state, or a
-- block it lifted; unblock: a block) is told of (`tell`, prelude.lua).
-- keys: per request `<key>:<algorithm>:<period>`; reserve, cancel and reset
-- add `...:freed` after the state key of GCRA and the buckets (slots given
-- back by cancelled reservations); then a request with a block, and every
-- request of a reset, adds its identity's block key `<key>:b`; the
-- `_once` ops take one more, last key: the request-id key
-- `<first key>:req:<escaped id>`. All keys of one call share one hash tag.
-- blocks and unblock take no request and one key, a block key.
--
-- probe decides like an acquire's first pass, commits nothing, and blocks
-- the identity under each refusing limit that blocks (a call over several
-- Redis Cluster hash tags asks it of the hash tags after the one that
-- refused, as all-or-nothing in one step would have decided them).
-- blocks answers the identity's blocks not ended (block.lua); unblock
-- lifts them all.
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
-- a batch naming one state twice, ratewall Request::check_batch; the code
-- stays exact for one all the same).
-- acquire_once returns the reply kept under the request-id key if there is
-- one; otherwise it decides like acquire and, when allowed, keeps the reply
-- there for the longest period of the call, at most KEEP_ONCE_MS. refund_once refunds and drops
-- the request-id key.
--
-- cancel_once is how a client takes back a call it gave up on (a timeout:
-- the call may have run, may run later, or never): if the request-id key
-- holds the call's kept reply, what it took is given back (each request
-- refunded at the reply's time); either way the key then holds a
-- tombstone ('x') for the longest period of the call, and an acquire_once
-- that finds a tombstone (the call arriving after its cancel) decides
-- nothing and takes nothing: its reply is every request refused, with a
-- retry_after of 0, marked as a replay.
--
-- reserve (a waiting call; rl-core/src/store/reserve.rs, the same rules): each
-- limit's earliest time is now plus its retry_after (given the slots
-- already reserved), or a slot given back to it; the slot is the latest
-- earliest time, or an earlier given-back time every limit can serve. A
-- slot more than `at` us away refuses the call and changes nothing (but
-- dropping given-back slots already past); otherwise every limit is
-- committed as of the slot (taking a given-back slot's units instead
-- where there is one), with TTLs from now. Reply: per request allowed,
-- limit, remaining, retry_after_us, reset_after_us and 1 if it took a
-- given-back slot; then the slot (0 when refused) and the now used.
-- cancel: per limit, the module's unreserve takes the reservation back if
-- it is still the last one made; otherwise the slot, if still ahead, is
-- recorded as given back (HINCRBY on `...:freed`, expiring at the slot).

local BATCH_HEADER = 4

-- The operations that end with a notice origin.
local TOLD = { refund = true, cancel_once = true, reset = true, unblock = true }

-- The slots given back under a request's state that are still ahead,
-- {slot = units}; drops the ones already past.
local function freed_slots(r, now)
  local flat = redis.call('HGETALL', r.freed)
  local slots = {}
  local past = {}
  for j = 1, #flat, 2 do
    local slot = tonumber(flat[j])
    if slot < now then
      past[#past + 1] = flat[j]
    else
      slots[slot] = tonumber(flat[j + 1])
    end
  end
  -- In HDELs of at most 1 000 fields: Lua unpacks no more than about
  -- 8 000 values at once, and cancelled reservations may give back more.
  for from = 1, #past, 1000 do
    redis.call('HDEL', r.freed, unpack(past, from, math.min(from + 999, #past)))
  end
  return slots
end

-- See the header: reserve.
local function reserve(requests, count, now, max_wait)
  local not_before = requests[1].x
  local probe, earliest, freed = {}, {}, {}
  local tail = math.max(now, not_before)
  for i = 1, count do
    local r = requests[i]
    local allowed, limit, remaining, retry_after, reset_after = ALG[r.alg].decide(r, now, false)
    probe[i] = { allowed, limit, math.max(remaining, 0), retry_after, reset_after }
    earliest[i] = math.max(now + retry_after, not_before)
    tail = math.max(tail, earliest[i])
    freed[i] = freed_slots(r, now)
  end
  local function serves(t)
    for j = 1, count do
      local units = freed[j][t]
      if t < earliest[j] and not (units and units >= requests[j].cost) then
        return false
      end
    end
    return true
  end
  local slot = tail
  for i = 1, count do
    for t, units in pairs(freed[i]) do
      if t < slot and t >= not_before and units >= requests[i].cost and serves(t) then
        slot = t
      end
    end
  end
  local out = {}
  if slot - now > max_wait then
    for i = 1, count do
      local p = probe[i]
      local o = (i - 1) * 6
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = p[1], p[2], p[3], p[4], p[5]
      out[o + 6] = 0
    end
    out[count * 6 + 1] = 0
    out[count * 6 + 2] = now
    return out
  end
  local base = EXTRA_TTL_MS
  if slot > now then
    EXTRA_TTL_MS = base + cdiv(slot - now, 1000)
  end
  for i = 1, count do
    local r = requests[i]
    local o = (i - 1) * 6
    local units = freed[i][slot]
    local allowed, limit, remaining, retry_after, reset_after
    if units and units >= r.cost then
      if units == r.cost then
        redis.call('HDEL', r.freed, fmt(slot))
      else
        redis.call('HINCRBY', r.freed, fmt(slot), -r.cost)
      end
      allowed, limit, remaining, retry_after, reset_after = ALG[r.alg].decide(r, slot, false)
      allowed, retry_after = 1, 0
      out[o + 6] = 1
    else
      allowed, limit, remaining, retry_after, reset_after = ALG[r.alg].decide(r, slot, true)
      out[o + 6] = 0
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
      allowed, limit, math.max(remaining, 0), retry_after, reset_after
  end
  EXTRA_TTL_MS = base
  out[count * 6 + 1] = slot
  out[count * 6 + 2] = now
  return out
end

-- See the header: cancel.
local function cancel(requests, count, now, slot)
  for i = 1, count do
    local r = requests[i]
    local restored = r.x == 0 and ALG[r.alg].unreserve(r, now, slot, r.y)
    if not restored and slot > now then
      redis.call('HINCRBY', r.freed, fmt(slot), r.cost)
      local ttl = ttl_ms(slot, now)
      if redis.call('PTTL', r.freed) < ttl then
        redis.call('PEXPIRE', r.freed, ttl)
      end
    end
  end
end

-- How long a request id's kept reply or tombstone lives at most (ms): the
-- longest period of the call, but no more than two minutes (a retry or a
-- cancel comes within seconds of the call; ratewall-redis' KEEP_ONCE).
local KEEP_ONCE_MS = 120000

-- RESERVES (generated, see script.rs): the algorithms that reserve, and so
-- keep given-back slots.

local function batch(keys, args)
  local op = args[1]
  local fields = 7
  if op == 'reserve' or op == 'cancel' then
    fields = 9
  end
  local tail = 0
  if TOLD[op] then
    tail = 1
  end
  if #args < BATCH_HEADER + tail or (#args - BATCH_HEADER - tail) % fields ~= 0 then
    return redis.error_reply('ERR ratewall-redis: malformed arguments (' .. #args .. ')')
  end
  local origin = ''
  if tail == 1 then
    origin = args[#args]
  end

  local now = clock(args[2])
  local at = tonumber(args[3])
  EXTRA_TTL_MS = tonumber(args[4]) or 0
  if op == 'blocks' or op == 'unblock' then
    if #keys ~= 1 or #args ~= BATCH_HEADER + tail then
      return redis.error_reply('ERR ratewall-redis: ' .. op .. ' takes one key and no request')
    end
    return blocks(keys[1], now, op == 'unblock', origin)
  end
  local freed_keys = op == 'reserve' or op == 'cancel' or op == 'reset'

  local count = (#args - BATCH_HEADER - tail) / fields
  local requests = {}
  local next_key = 1
  for i = 1, count do
    local a = BATCH_HEADER + (i - 1) * fields
    local r, unknown = request_at(args, a, fields, keys[next_key])
    if r == nil then
      return unknown
    end
    next_key = next_key + 1
    if r.alg == 'if' then
      r.lease = args[a + 5]
    end
    if freed_keys and RESERVES[r.alg] then
      r.freed = keys[next_key]
      next_key = next_key + 1
    end
    -- How the request is decided: with its block when it has one.
    r.block = tonumber(args[a + fields])
    r.decide = ALG[r.alg].decide
    if r.block > 0 or op == 'reset' then
      r.bk = keys[next_key]
      next_key = next_key + 1
      if r.block > 0 then
        r.decide = decide_blocking
      end
    end
    if (op == 'reserve' or op == 'cancel') and not RESERVES[r.alg] then
      return redis.error_reply('ERR ratewall-redis: ' .. tostring(r.alg) .. ' cannot reserve a slot')
    end
    requests[i] = r
  end
  local once = op == 'acquire_once' or op == 'refund_once' or op == 'cancel_once'
  local id_key
  if once then
    id_key = keys[next_key]
    next_key = next_key + 1
  end
  if next_key - 1 ~= #keys then
    return redis.error_reply('ERR ratewall-redis: expected ' .. (next_key - 1) .. ' keys, got ' .. #keys)
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

  -- Whether request i was refused (its decision emitted).
  local function refused(i)
    return out[(i - 1) * 5 + 1] == 0
  end

  -- Decides every request without committing and emits it, blocking the
  -- refusing limits that block when one refused; true when all allowed.
  local function probe()
    local all = true
    for i = 1, count do
      local r = requests[i]
      if not emit(i, r.decide(r, now, false)) then
        all = false
      end
    end
    if not all then
      block_refused(requests, count, now, refused)
    end
    return all
  end

  -- Decides the batch all-or-nothing and emits it; true when all allowed.
  local function acquire()
    local all = true
    if count > 1 then
      all = probe()
    end
    if all then
      for i = 1, count do
        local r = requests[i]
        for j = 1, i - 1 do
          if requests[j].key == r.key then
            r.st = nil
          end
        end
        if not emit(i, r.decide(r, now, true)) then
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
    if kept == 'x' then
      -- Cancelled before it arrived: nothing is decided or taken.
      for i = 1, count do
        local r = requests[i]
        emit(i, 0, r.t, 0, 0, 0)
      end
      out[#out + 1] = now
      out[#out + 1] = 1
      out[#out + 1] = now
      return out
    end
    if kept then
      local values = {}
      for v in string.gmatch(kept, '[^,]+') do
        values[#values + 1] = tonumber(v)
      end
      if #values ~= count * 5 + 1 then
        return redis.error_reply('ERR ratewall-redis: request id reused for a call with ' .. count
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
        fmt(math.min(math.max(cdiv(longest, 1000), 1), KEEP_ONCE_MS) + EXTRA_TTL_MS))
      out[#out + 1] = 0
      out[#out + 1] = now
      return out
    end
    out[#out + 1] = now
    out[#out + 1] = 0
    out[#out + 1] = now
    return out
  elseif op == 'peek' then
    -- As of `at` us from now (0: now): what each state holds then, with no
    -- call in between (deciding writes nothing).
    local when = now + (at or 0)
    for i = 1, count do
      local r = requests[i]
      emit(i, r.decide(r, when, false))
    end
    -- The decisions' time.
    now = when
  elseif op == 'probe' then
    probe()
  elseif op == 'cancel_once' then
    local kept = redis.call('GET', id_key)
    local longest = 0
    for i = 1, count do
      longest = math.max(longest, requests[i].p)
    end
    if kept and kept ~= 'x' then
      -- The call ran and was allowed: give back what it took, at its time.
      local taken_at = tonumber(string.match(kept, '([^,]+)$'))
      local given = {}
      for i = 1, count do
        local r = requests[i]
        if ALG[r.alg].refund(r, now, taken_at) then
          given[#given + 1] = r.key
        end
      end
      tell(origin, given)
    end
    redis.call('SET', id_key, 'x', 'PX',
      fmt(math.min(math.max(cdiv(longest, 1000), 1), KEEP_ONCE_MS) + EXTRA_TTL_MS))
  elseif op == 'refund' or op == 'refund_once' then
    local given = {}
    for i = 1, count do
      local r = requests[i]
      if ALG[r.alg].refund(r, now, at) then
        given[#given + 1] = r.key
      end
    end
    tell(origin, given)
    if id_key then
      redis.call('DEL', id_key)
    end
  elseif op == 'charge' then
    for i = 1, count do
      local r = requests[i]
      local charge = ALG[r.alg].charge
      if r.cost > 0 and charge then
        charge(r, now)
      end
    end
  elseif op == 'hold' then
    -- `at` is how far ahead (us), each request's cost the units left then.
    for i = 1, count do
      local r = requests[i]
      local hold = ALG[r.alg].hold
      if hold then
        hold(r, now, at)
      end
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
    local given = {}
    for i = 1, count do
      local r = requests[i]
      local lifted = redis.call('HDEL', r.bk, string.sub(r.key, #r.bk))
      if redis.call('DEL', r.key) == 1 or lifted == 1 then
        given[#given + 1] = r.key
      end
      if r.freed then
        redis.call('DEL', r.freed)
      end
    end
    tell(origin, given)
  elseif op == 'reserve' then
    return reserve(requests, count, now, at)
  elseif op == 'cancel' then
    cancel(requests, count, now, at)
  else
    return redis.error_reply('ERR ratewall-redis: unknown operation ' .. tostring(op))
  end

  out[#out + 1] = now
  return out
end

-- The read-only batch (FCALL_RO, a function flagged no-writes): peeks
-- and blocks only.
local function batch_ro(keys, args)
  if args[1] ~= 'peek' and args[1] ~= 'blocks' then
    return redis.error_reply('ERR ratewall-redis: ' .. tostring(args[1]) .. ' is not read-only')
  end
  return batch(keys, args)
end
