-- delete: removes a record, with its index entries, unless it is in
-- progress or, for a positive fence, its fence is another (it ran again
-- since the caller was shown it).
-- ARGV: fence (0: any)
-- Returns 0 deleted, 1 absent, 2 in progress, 3 another fence (nothing
-- changed but for 0).
local rk = KEYS[REC]
local v = redis.call('HMGET', rk, 'st', 'f')
if not v[1] then
  return 1
end
if ARGV[1] ~= '0' and v[2] ~= ARGV[1] then
  return 3
end
if v[1] == IN_PROGRESS then
  return 2
end
redis.call('DEL', rk)
unindex(idx, rk)
return 0
