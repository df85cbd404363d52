-- defer: reschedules the reconciliation of an unknown record, or gives up on
-- it (dead letter: never due again, its reconcile_after kept), if the
-- attempt is about its execution (fence) and was not counted yet (the
-- attempts the caller was shown). A record dead-lettered before stays so.
-- ARGV: clock, grace_ms, delay_us, last_error, dead_letter ('1'/'0'), fence, attempts
-- Returns 0 done, 1 absent, 2 not unknown or attempts moved on, 3 another fence.
local rk = KEYS[REC]
local now = clock(ARGV[1])
local grace, ra = tonumber(ARGV[2]), now + tonumber(ARGV[3])
local v = redis.call('HMGET', rk, 'st', 'pol', 'lu', 'ea', 'f', 'rat', 'ra')
if not v[1] then
  return 1
end
if v[5] ~= ARGV[6] then
  return 3
end
if v[1] ~= UNKNOWN or tonumber(v[6] or '0') ~= tonumber(ARGV[7]) then
  return 2
end
redis.call('HINCRBY', rk, 'rat', 1)
if ARGV[5] == '1' then
  redis.call('HSET', rk, 'dla', num(now), 'le', ARGV[4], 'ua', num(now))
  ra = tonumber(v[7])
else
  redis.call('HSET', rk, 'ra', num(ra), 'le', ARGV[4], 'ua', num(now))
end
settle(idx, rk, UNKNOWN, v[2], tonumber(v[3]), ra, tonumber(v[4]), now, grace)
return 0
