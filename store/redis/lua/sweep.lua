-- sweep: moves the given records of one shard that are still in_progress,
-- under policy unknown, with an expired lease, to unknown due now. The check
-- is repeated here, so concurrent sweepers move each record once.
-- KEYS: the shard's index keys, then records.
-- ARGV: clock, grace_ms, sweep_grace_us (only leases that ended that long
-- ago are swept)
-- Returns the HGETALL of every record moved.
local now = clock(ARGV[1])
local grace, cutoff = tonumber(ARGV[2]), now - tonumber(ARGV[3])
local out = {}
for i = REC, #KEYS do
  local rk = KEYS[i]
  local v = redis.call('HMGET', rk, 'st', 'pol', 'lu', 'ea')
  if not v[1] then
    unindex(idx, rk)
  elseif v[1] == IN_PROGRESS and v[2] == 'unknown' and tonumber(v[3]) <= cutoff then
    redis.call('HSET', rk, 'st', UNKNOWN, 'ra', num(now), 'le', 'lease_expired', 'ua', num(now))
    settle(idx, rk, UNKNOWN, v[2], tonumber(v[3]), now, tonumber(v[4]), now, grace)
    out[#out + 1] = redis.call('HGETALL', rk)
  end
end
return out
