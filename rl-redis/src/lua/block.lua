-- Blocks (a penalty box, ratewall Limit::with_block; the memory store's
-- twin is rl-core/src/store/memory/block.rs): once a limit with a block
-- refuses an identity, the identity is refused by that limit until the
-- block ends. Decided by the batch entry point only (a request with a
-- block never goes to single.lua, whose path stays as it is).
--
-- key: one HASH per identity key, `<key>:b` (`<key>` is the identity's
-- `prefix:{scope:identity}`, so it shares the hash slot of its state
-- keys), passed after the request's state key (and given-back key); field:
-- the limit's storage suffix (the state key after `<key>:`, taken from it
-- here: `<alg>:<period>[:<slots>]`); value: the block's end (us). Its TTL
-- is the latest end among its fields (ended fields are ignored, and go
-- with the key).
--
-- A request's `block` (us, 0: none) is its last field in the batch.

-- The end of the request's block (0: none), read once per request.
local function block_end(r)
  local e = r.bend
  if e == nil then
    e = tonumber(redis.call('HGET', r.bk, string.sub(r.key, #r.bk))) or 0
    r.bend = e
  end
  return e
end

-- Blocks the request's identity from `now` for its block.
local function block_write(r, now)
  local e = now + r.block
  redis.call('HSET', r.bk, string.sub(r.key, #r.bk), e)
  local ms = ttl_ms(e, now)
  if redis.call('PTTL', r.bk) < ms then
    redis.call('PEXPIRE', r.bk, ms)
  end
  r.bend = e
end

-- decide(r, now, commit) for a request whose limit blocks: an identity
-- blocked after `now` is refused until the end (its state decided without
-- a commit: the retry and reset are the later of the block's end and the
-- state's own, remaining 0); otherwise the state decides, and a refusal
-- blocks the identity from `now` when `commit` (a peek and an
-- all-or-nothing call's first pass answer the same; the acquire writes
-- the first pass's refusals with block_refused). ratewall decide_blocking.
local function decide_blocking(r, now, commit)
  local e = block_end(r)
  if e > now then
    local _, limit, _, retry_after, reset_after = ALG[r.alg].decide(r, now, false)
    return 0, limit, 0, math.max(retry_after, e - now), math.max(reset_after, e - now)
  end
  local allowed, limit, remaining, retry_after, reset_after = ALG[r.alg].decide(r, now, commit)
  if allowed == 1 then
    return allowed, limit, remaining, retry_after, reset_after
  end
  if commit then
    block_write(r, now)
  end
  return 0, limit, 0, math.max(retry_after, r.block), math.max(reset_after, r.block)
end

-- After an all-or-nothing call's first pass refused it: blocks each
-- refusing request whose limit blocks and whose identity is not blocked
-- already (`refused(i)`: whether request i refused). A refusal during a
-- block does not extend it.
local function block_refused(requests, count, now, refused)
  for i = 1, count do
    local r = requests[i]
    if r.block > 0 and refused(i) and block_end(r) <= now then
      block_write(r, now)
    end
  end
end

-- The blocks of the identity whose block key is `bk`, not ended by `now`:
-- suffix and time left (us), flat; then `now`. With `lift`, the key is
-- dropped (every block lifted), the other processes are told of the
-- identity's key when a block had not ended (`origin`: see `tell`,
-- prelude.lua), and the reply is 1 if one had not (0 otherwise), then
-- `now`.
local function blocks(bk, now, lift, origin)
  local flat = redis.call('HGETALL', bk)
  local out = {}
  for j = 1, #flat, 2 do
    local e = tonumber(flat[j + 1])
    if e and e > now then
      out[#out + 1] = flat[j]
      out[#out + 1] = e - now
    end
  end
  if lift then
    redis.call('DEL', bk)
    local any = 0
    if #out > 0 then
      any = 1
      tell(origin, { bk })
    end
    return { any, now }
  end
  out[#out + 1] = now
  return out
end
