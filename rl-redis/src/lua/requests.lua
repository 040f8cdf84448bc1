-- The requests of a batch or a lease call, as both entry points read them
-- (batch.lua, lease.lua): after the call's header, `fields` arguments per
-- request, and its state key first among its keys.

-- The request whose fields follow args[a]: algorithm code, threshold,
-- period (us), burst, slots, cost, then up to three numbers x, y, z (an
-- entry point's own; nil past `fields`), and its state key. Its
-- algorithm's module is loaded on first use. nil and an error reply for an
-- unknown algorithm.
local function request_at(args, a, fields, key)
  local r = {
    alg = args[a + 1],
    t = tonumber(args[a + 2]),
    p = tonumber(args[a + 3]),
    b = tonumber(args[a + 4]),
    slots = tonumber(args[a + 5]),
    cost = tonumber(args[a + 6]),
    key = key,
  }
  if fields >= 7 then r.x = tonumber(args[a + 7]) end
  if fields >= 8 then r.y = tonumber(args[a + 8]) end
  if fields >= 9 then r.z = tonumber(args[a + 9]) end
  if ALG[r.alg] == nil then
    local loader = LOADERS[r.alg]
    if loader == nil then
      return nil, redis.error_reply('ERR ratewall-redis: unknown algorithm ' .. tostring(r.alg))
    end
    ALG[r.alg] = loader()
  end
  return r
end
