-- ratewall-redis: reads the allow and deny lists of a key prefix when they changed.
--
-- KEYS[1]  the lists hash, `<prefix>:{lists}`
-- KEYS[2]  its version, `<prefix>:{lists}:version`
-- ARGV[1]  the version the reader holds
--
-- Reply: {version} when unchanged, else {version, field, value, field, value, ...}.
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
if version == tonumber(ARGV[1]) then
  return { version }
end
local reply = { version }
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do
  reply[i + 1] = all[i]
end
return reply
