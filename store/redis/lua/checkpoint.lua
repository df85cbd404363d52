-- checkpoint: sets recovery_point of an in_progress record (current fence).
-- ARGV: clock, fence, recovery_point
-- Returns 0 done, 1 absent, 2 not in_progress or another fence.
local rk = KEYS[REC]
local now = clock(ARGV[1])
local v = redis.call('HMGET', rk, 'st', 'f')
if not v[1] then
  return 1
end
if v[1] ~= IN_PROGRESS or v[2] ~= ARGV[2] then
  return 2
end
redis.call('HSET', rk, 'rp', ARGV[3], 'ua', num(now))
return 0
