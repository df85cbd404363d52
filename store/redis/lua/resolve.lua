-- resolve: unknown -> completed (with a response) or failed_retryable.
-- ARGV: clock, grace_ms, target state, ttl_us, status, header, body, has_body, omitted, fence
-- Returns 0 done, 1 absent, 2 not unknown, 3 another fence.
local rk = KEYS[REC]
local now = clock(ARGV[1])
local grace, to, ttl = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local v = redis.call('HMGET', rk, 'st', 'pol', 'lu', 'ea', 'f')
if not v[1] then
  return 1
end
if v[5] ~= ARGV[10] then
  return 3
end
if v[1] ~= UNKNOWN then
  return 2
end
local ea = tonumber(v[4])
if ttl > 0 then
  ea = now + ttl
end
if to == COMPLETED then
  set_response(rk, 5)
  redis.call('HSET', rk, 'cpa', num(now), 'le', '')
end
redis.call('HSET', rk, 'st', to, 'ea', num(ea), 'ua', num(now))
redis.call('HDEL', rk, 'ra', 'dla')
settle(idx, rk, to, v[2], tonumber(v[3]), 0, ea, now, grace)
return 0
