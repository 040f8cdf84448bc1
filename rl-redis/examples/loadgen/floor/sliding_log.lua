-- Minimal sliding log, written by hand: the loadgen's floor for ratewall-redis'
-- own. Same reply: allowed, limit, remaining, retry_after_us,
-- reset_after_us, now.
-- KEYS[1] the log (ZSET), KEYS[2] its id sequence; ARGV threshold,
-- period (us), cost.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local limit, period, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
local n = redis.call('ZCARD', KEYS[1])
if n + cost > limit then
  local k = n + cost - limit - 1
  local oldest = redis.call('ZRANGE', KEYS[1], k, k, 'WITHSCORES')
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  return { 0, limit, limit - n, oldest[2] + period - now, newest[2] + period - now, now }
end
local last = redis.call('INCRBY', KEYS[2], cost)
for id = last - cost + 1, last do
  redis.call('ZADD', KEYS[1], now, id)
end
local ttl = math.ceil(period / 1000)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return { 1, limit, limit - n - cost, 0, period, now }
