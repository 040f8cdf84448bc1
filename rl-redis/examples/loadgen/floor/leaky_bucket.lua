-- Minimal leaky bucket, written by hand: the loadgen's floor for ratewall-redis'
-- own. Same reply: allowed, limit, remaining, retry_after_us,
-- reset_after_us, now.
-- KEYS[1] (level x period, updated at); ARGV threshold (drain per period),
-- period (us), burst (capacity), cost.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local rate, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local full = burst * period
local level = 0
local value = redis.call('GET', KEYS[1])
if value then
  local scaled, updated = struct.unpack('<dd', value)
  level = math.max(0, scaled - (now - updated) * rate)
end
local need = cost * period
if level + need > full then
  return { 0, burst, math.floor((full - level) / period), math.ceil((level + need - full) / rate),
    math.ceil(level / rate), now }
end
level = level + need
local empty_in = math.ceil(level / rate)
redis.call('SET', KEYS[1], struct.pack('<dd', level, now), 'PX', math.ceil(empty_in / 1000))
return { 1, burst, math.floor((full - level) / period), 0, empty_in, now }
