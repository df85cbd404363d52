-- delete: removes a record whatever its state, with its index entries.
-- Returns 1 deleted, 0 absent.
local idx = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}
local rk = KEYS[5]
if redis.call('DEL', rk) == 0 then
  return 0
end
unindex(idx, rk)
return 1
