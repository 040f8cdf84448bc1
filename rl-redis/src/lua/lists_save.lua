-- ratewall-redis: records one change of the allow and deny lists of a key prefix.
--
-- KEYS[1]  the lists hash, `<prefix>:{lists}`
-- KEYS[2]  its version, `<prefix>:{lists}:version` (same hash tag: one slot)
-- ARGV[1]  the field: the JSON array [name, identity] (name "" for every limit)
-- ARGV[2]  the JSON entry, or "" to remove the field
--
-- The change and the new version are written together, so a reader that
-- sees the version sees the change.
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return redis.call('INCR', KEYS[2])
