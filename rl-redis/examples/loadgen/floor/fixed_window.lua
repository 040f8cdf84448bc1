-- Minimal fixed window, written by hand: the loadgen's floor for ratewall-redis'
-- own. Same reply: allowed, limit, remaining, retry_after_us,
-- reset_after_us, now.
-- KEYS[1] the (window, count) pair; ARGV threshold, period (us), cost.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local limit, period, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window = math.floor(now / period)
local reset = (window + 1) * period - now
local count = 0
local value = redis.call('GET', KEYS[1])
if value then
  local w, n = struct.unpack('<dd', value)
  if w == window then
    count = n
  end
end
if count + cost > limit then
  return { 0, limit, limit - count, reset, reset, now }
end
count = count + cost
redis.call('SET', KEYS[1], struct.pack('<dd', window, count), 'PX', math.ceil(reset / 1000))
return { 1, limit, limit - count, 0, reset, now }
