-- Minimal GCRA, written by hand: the loadgen's floor for ratewall-redis' own.
-- Same reply: allowed, limit, remaining, retry_after_us, reset_after_us, now.
-- KEYS[1] the TAT; ARGV threshold, period (us), burst, cost.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local threshold, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local interval = math.ceil(period / threshold)
local tau = interval * burst
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + cost * interval
local allow_at = new_tat - tau
if now < allow_at then
  return { 0, burst, 0, allow_at - now, tat - now, now }
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return { 1, burst, math.floor((now - allow_at) / interval), 0, new_tat - now, now }
