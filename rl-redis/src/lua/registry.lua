-- ratewall-redis: records one limit name's limits in the limits registry.
--
-- KEYS[1]  the registry hash, `<prefix>:{limits}` (its own hash tag)
-- ARGV[1]  the limit name (the hash field)
-- ARGV[2]  the JSON description of its limits (the value)
-- ARGV[3]  the registry's time to live in milliseconds
--
-- Field and TTL are written together so the hash never exists without one.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
