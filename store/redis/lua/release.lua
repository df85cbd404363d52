-- release: in_progress (current fence) -> failed_retryable (Release) or
-- unknown due now (MarkUnknown).
-- ARGV: clock, grace_ms, fence, target state, last_error, and for
-- MarkUnknown the request summary ('' keeps the request the record holds).
-- Returns 0 done, 1 absent, 2 not in_progress or another fence.
local rk = KEYS[REC]
local now = clock(ARGV[1])
local grace, to = tonumber(ARGV[2]), ARGV[4]

local v = redis.call('HMGET', rk, 'st', 'f', 'pol', 'lu', 'ea')
if not v[1] then
  return 1
end
if v[1] ~= IN_PROGRESS or v[2] ~= ARGV[3] then
  return 2
end
redis.call('HSET', rk, 'st', to, 'le', ARGV[5], 'ua', num(now))
if to == UNKNOWN then
  redis.call('HSET', rk, 'ra', num(now))
  if ARGV[6] and ARGV[6] ~= '' then
    redis.call('HSET', rk, 'rq', ARGV[6])
  end
end
settle(idx, rk, to, v[3], tonumber(v[4]), now, tonumber(v[5]), now, grace)
return 0
