-- reap: for the given records of one shard whose expires_at is past, deletes
-- (or soft-expires) terminal ones and turns unknown ones, and in_progress
-- ones whose lease ended lease_grace_us ago too, into completed records
-- holding the abandoned response. The check is repeated
-- here, so concurrent reapers change each record once.
-- KEYS: the shard's index keys, then records.
-- ARGV: clock, grace_ms, soft ('1'/'0'), abandoned_ttl_us, lease_grace_us,
--       status, header, body, has_body, omitted (the abandoned response)
-- Returns {deleted, abandoned}.
local now = clock(ARGV[1])
local grace, soft, abttl = tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local cutoff = now - tonumber(ARGV[5])
local deleted, abandoned = 0, 0
for i = REC, #KEYS do
  local rk = KEYS[i]
  local v = redis.call('HMGET', rk, 'st', 'pol', 'lu', 'ea')
  local st, ea = v[1], tonumber(v[4])
  if not st then
    -- Evicted by its TTL before any reaper came: only the entry is left.
    unindex(idx, rk)
  elseif ea <= now then
    if terminal(st) then
      if soft then
        redis.call('HSET', rk, 'st', EXPIRED, 'ua', num(now))
        settle(idx, rk, EXPIRED, v[2], tonumber(v[3]), 0, ea, now, grace)
      else
        redis.call('DEL', rk)
        unindex(idx, rk)
      end
      deleted = deleted + 1
    elseif st == UNKNOWN or (st == IN_PROGRESS and tonumber(v[3]) <= cutoff) then
      set_response(rk, 6)
      local nea = now + abttl
      redis.call('HSET', rk, 'st', COMPLETED, 'le', 'abandoned', 'cpa', num(now), 'ua', num(now), 'ea', num(nea))
      redis.call('HDEL', rk, 'ra', 'dla')
      settle(idx, rk, COMPLETED, v[2], tonumber(v[3]), 0, nea, now, grace)
      abandoned = abandoned + 1
    end
  end
end
return {deleted, abandoned}
