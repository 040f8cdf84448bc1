-- ratewall-redis: one change to a learned scale (what every instance sharing
-- a budget learned of its upstream's limit), by the server's time. The same
-- rule as `ratewall::upstream::Learned::adjusted`.
--
-- KEYS[1]  the scale's hash, `<prefix>:{learned}:<name>`: scale (parts per
--          million of the stated limits), changed and lowered (µs)
-- ARGV[1]  'read' | 'raise' | 'lower' | 'set'
-- ARGV[2]  raise: parts per million of the scale added; lower: kept;
--          set: the new scale (already within floor ..= ceiling)
-- ARGV[3]  raise: µs since the last change; lower: µs since the last
--          lowering (the cooldown)
-- ARGV[4]  time to live in milliseconds, set again on every write
-- ARGV[5]  the scale of the stated limits (one); ARGV[6] lower: the
--          lowest scale (already within the floor ..= one)
-- ARGV[7]  now in µs when the backend keeps time itself, else '' (the
--          server's TIME)
--
-- Returns the scale after the change.

-- Redis < 5 replicates scripts verbatim, which forbids TIME before a write
-- unless the script asks for effects replication (7 announces itself with
-- REDIS_VERSION, where the call is skipped).
if redis.replicate_commands and not redis.REDIS_VERSION then
  redis.replicate_commands()
end
local ONE, FLOOR = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = tonumber(ARGV[7])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local held = redis.call('HMGET', KEYS[1], 'scale', 'changed', 'lowered')
local scale = tonumber(held[1]) or ONE
local changed = tonumber(held[2]) or 0
local lowered = tonumber(held[3]) or 0
local op, amount, interval = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- Time since a change, never negative (a client clock behind the last writer's).
local function since(at)
  return math.max(now - at, 0)
end

if op == 'raise' then
  if amount == 0 or scale >= ONE or since(changed) < interval then
    return scale
  end
  scale = math.min(ONE, scale + math.max(1, math.floor(scale * amount / ONE)))
elseif op == 'lower' then
  if lowered ~= 0 and since(lowered) < interval then
    return scale
  end
  scale = math.max(FLOOR, math.floor(scale * amount / ONE))
  lowered = now
elseif op == 'set' then
  scale = amount
else
  return scale
end
redis.call('HMSET', KEYS[1], 'scale', scale, 'changed', now, 'lowered', lowered)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return scale
