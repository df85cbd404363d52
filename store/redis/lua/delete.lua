-- delete: removes a record, with its index entries, unless it is in
-- progress. Returns 1 deleted, 0 absent, 2 in progress (nothing changed).
local rk = KEYS[REC]
local state = redis.call('HGET', rk, 'st')
if not state then
  return 0
end
if state == IN_PROGRESS then
  return 2
end
redis.call('DEL', rk)
unindex(idx, rk)
return 1
