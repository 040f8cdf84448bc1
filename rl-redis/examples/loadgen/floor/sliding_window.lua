-- Minimal sliding-window counter, written by hand: the loadgen's floor for
-- ratewall-redis' own. Same reply: allowed, limit, remaining, retry_after_us
-- (to the next slot: an estimate), reset_after_us, now.
-- KEYS[1] the slot counts (HASH); ARGV threshold, period (us), slots, cost.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local limit, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local slots, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local size = math.floor(period / slots)
local s = math.floor(now / size)
local raw = redis.call('HGETALL', KEYS[1])
local counts, stale = {}, {}
for j = 1, #raw, 2 do
  local i = tonumber(raw[j])
  if i + slots < s then
    stale[#stale + 1] = raw[j]
  else
    counts[i] = tonumber(raw[j + 1])
  end
end
local full = 0
for i = s - slots + 1, s do
  full = full + (counts[i] or 0)
end
local estimate = full * size + ((s + 1) * size - now) * (counts[s - slots] or 0)
local capacity = limit * size
if estimate + cost * size > capacity then
  return { 0, limit, math.floor((capacity - estimate) / size), (s + 1) * size - now, period, now }
end
redis.call('HINCRBY', KEYS[1], s, cost)
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
redis.call('PEXPIRE', KEYS[1], math.ceil((period + size) / 1000))
return { 1, limit, math.floor((capacity - estimate - cost * size) / size), 0, (s + slots + 1) * size - now, now }
