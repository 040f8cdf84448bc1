-- ratewall-redis: one change to a learned scale (what every instance sharing
-- a budget learned of its upstream's limit), by the server's time. The same
-- rule, in the same integers, as `ratewall::upstream::Learned::adjusted`.
--
-- KEYS[1]  the scale's hash, `<prefix>:{learned}:<name>`: scale (parts per
--          million of the stated limits), changed and lowered (µs), ceiling
--          (the upstream's limit as last found, parts per million; 0: none)
--          and found (µs)
-- ARGV[1]  'read' | 'raise' | 'lower' | 'found' | 'set'
-- ARGV[2]  time to live in milliseconds, set again on every write
-- ARGV[3]  the scale of the stated limits (one)
-- ARGV[4]  now in µs when the backend keeps time itself, else '' (the
--          server's TIME)
-- ARGV[5..] raise: step, approach, headroom (parts per million), every,
--          believe_for (µs); lower: keep, estimate, headroom, cooldown (µs),
--          floor; found: estimate, headroom; set: the new scale (already
--          within floor ..= ceiling)
--
-- Returns the scale after the change.

-- Redis < 5 replicates scripts verbatim, which forbids TIME before a write
-- unless the script asks for effects replication (7 announces itself with
-- REDIS_VERSION, where the call is skipped).
if redis.replicate_commands and not redis.REDIS_VERSION then
  redis.replicate_commands()
end
local ONE = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local held = redis.call('HMGET', KEYS[1], 'scale', 'changed', 'lowered', 'ceiling', 'found')
local scale = tonumber(held[1]) or ONE
local changed = tonumber(held[2]) or 0
local lowered = tonumber(held[3]) or 0
local ceiling = tonumber(held[4]) or 0
local found = tonumber(held[5]) or 0
local op = ARGV[1]
local a, b, c, d, e = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
  tonumber(ARGV[8]), tonumber(ARGV[9])

-- Time since a change, never negative (a client clock behind the last writer's).
local function since(at)
  return math.max(now - at, 0)
end

-- `value` times `share` parts per million, rounded down (products stay
-- below 2^53: a scale is at most 1000 * ONE).
local function share_of(value, share)
  return math.floor(value * share / ONE)
end

if op == 'raise' then
  local step, approach, headroom, every, believe = a, b, c, d, e
  if since(changed) < every then
    return scale
  end
  if ceiling > 0 and since(found) < believe then
    local target = math.min(share_of(ceiling, math.min(headroom, ONE)), ONE)
    if scale >= target or approach == 0 then
      return scale
    end
    scale = math.min(target, scale + math.max(1, share_of(target - scale, math.min(approach, ONE))))
  else
    if step == 0 or scale >= ONE then
      return scale
    end
    scale = math.min(ONE, scale + math.max(1, share_of(scale, math.min(step, ONE))))
  end
  changed = now
elseif op == 'lower' then
  local keep, estimate, headroom, cooldown, floor = a, b, c, d, e
  if lowered ~= 0 and since(lowered) < cooldown then
    return scale
  end
  if estimate > 0 then
    ceiling = math.min(estimate, 1000 * ONE)
    scale = math.min(scale, share_of(ceiling, math.min(headroom, ONE)))
  else
    ceiling = scale
    scale = share_of(scale, math.min(keep, ONE))
  end
  scale = math.max(scale, floor)
  changed, lowered, found = now, now, now
elseif op == 'found' then
  local estimate, headroom = a, b
  ceiling = math.max(math.min(estimate, 1000 * ONE), math.floor(ONE / 1000))
  local under = math.max(share_of(ceiling, math.min(headroom, ONE)), math.floor(ONE / 1000))
  if scale > under then
    scale = under
    changed = now
  end
  found = now
elseif op == 'set' then
  scale = a
  changed = now
  ceiling, found = 0, 0
else
  return scale
end
redis.call('HSET', KEYS[1], 'scale', scale, 'changed', changed, 'lowered', lowered,
  'ceiling', ceiling, 'found', found)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return scale
