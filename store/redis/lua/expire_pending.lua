-- expire_pending: phase 2 of store.Queue.ExpirePending on one shard. Each
-- given record still pending with its deadline passed becomes completed
-- with the timeout answer; the check is made here, so concurrent callers
-- end each record once.
-- KEYS: the shard's index keys, the pending deadline index, then
-- records.
-- ARGV: clock, grace_ms, ttl_us (0 keeps expires_at), the shard's tag,
-- then the response (see set_response)
-- Returns the HGETALL of every record ended.
local pd = KEYS[REC]
local now = clock(ARGV[1])
local grace, ttl, tag = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {}
for i = REC + 1, #KEYS do
  local rk = KEYS[i]
  local v = redis.call('HMGET', rk, 'st', 'q', 'lu', 'ea', 'pol')
  if v[1] ~= 'pending' then
    redis.call('ZREM', pd, rk)
  elseif tonumber(v[3]) <= now then
    local ea = tonumber(v[4])
    if ttl > 0 then
      ea = now + ttl
    end
    set_response(rk, 5)
    redis.call('HSET', rk, 'st', COMPLETED, 'le', 'pending_expired', 'cpa', num(now), 'ua', num(now), 'ea', num(ea))
    -- The queue index is this shard's: same slot.
    redis.call('ZREM', tag .. 'i:pq:' .. v[2], rk)
    redis.call('ZREM', pd, rk)
    settle(idx, rk, COMPLETED, v[5], tonumber(v[3]), 0, ea, now, grace)
    out[#out + 1] = redis.call('HGETALL', rk)
  end
end
return out
