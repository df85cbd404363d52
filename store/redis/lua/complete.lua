-- complete: in_progress (current fence) -> completed with a response.
-- ARGV: clock, grace_ms, fence, ttl_us, status, header, body, has_body, omitted
-- Returns 0 done, 1 absent, 2 not in_progress or another fence.
local rk = KEYS[REC]
local now = clock(ARGV[1])
local grace, ttl = tonumber(ARGV[2]), tonumber(ARGV[4])

local v = redis.call('HMGET', rk, 'st', 'f', 'pol', 'lu', 'ea')
if not v[1] then
  return 1
end
if v[1] ~= IN_PROGRESS or v[2] ~= ARGV[3] then
  return 2
end
local ea = tonumber(v[5])
if ttl > 0 then
  ea = now + ttl
end
set_response(rk, 5)
redis.call('HSET', rk, 'st', COMPLETED, 'cpa', num(now), 'ua', num(now), 'ea', num(ea))
settle(idx, rk, COMPLETED, v[3], tonumber(v[4]), 0, ea, now, grace)
return 0
