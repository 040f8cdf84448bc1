-- Minimal token bucket, written by hand: the loadgen's floor for ratewall-redis'
-- own. Same reply: allowed, limit, remaining, retry_after_us,
-- reset_after_us, now.
-- KEYS[1] (tokens x period, updated at); ARGV threshold (refill per
-- period), period (us), burst (capacity), cost.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local rate, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local full = burst * period
local tokens = full
local value = redis.call('GET', KEYS[1])
if value then
  local scaled, updated = struct.unpack('<dd', value)
  tokens = math.min(full, scaled + (now - updated) * rate)
end
local need = cost * period
if tokens < need then
  return { 0, burst, math.floor(tokens / period), math.ceil((need - tokens) / rate),
    math.ceil((full - tokens) / rate), now }
end
tokens = tokens - need
local full_in = math.ceil((full - tokens) / rate)
redis.call('SET', KEYS[1], struct.pack('<dd', tokens, now), 'PX', math.ceil(full_in / 1000))
return { 1, burst, math.floor(tokens / period), 0, full_in, now }
