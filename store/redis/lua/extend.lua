-- extend: renews the lease of an in_progress record (current fence).
-- ARGV: clock, grace_ms, fence, lease_us
-- Returns 0 done, 1 absent, 2 not in_progress or another fence.
local rk = KEYS[REC]
local now = clock(ARGV[1])
local grace, lu = tonumber(ARGV[2]), now + tonumber(ARGV[4])
local v = redis.call('HMGET', rk, 'st', 'f', 'pol', 'ea')
if not v[1] then
  return 1
end
if v[1] ~= IN_PROGRESS or v[2] ~= ARGV[3] then
  return 2
end
redis.call('HSET', rk, 'lu', num(lu), 'ua', num(now))
settle(idx, rk, IN_PROGRESS, v[3], lu, 0, tonumber(v[4]), now, grace)
return 0
