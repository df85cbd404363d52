-- claim: phase 2 of store.Queue.Claim on one shard. Each given record that
-- is still pending in this queue with its deadline ahead moves to
-- in_progress (a new fence, attempts + 1, a lease); the check is made
-- here, so of two claimers that picked one record only one takes it.
-- Entries whose record is gone or no longer pending in this queue are
-- dropped from the queue index.
-- KEYS: the shard's index keys, the queue index, the pending deadline
-- index, then records.
-- ARGV: clock, grace_ms, lease_us, queue
-- Returns the HGETALL of every record claimed.
local pq, pd = KEYS[REC], KEYS[REC + 1]
local now = clock(ARGV[1])
local grace, lease, queue = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {}
for i = REC + 2, #KEYS do
  local rk = KEYS[i]
  local v = redis.call('HMGET', rk, 'st', 'q', 'lu', 'f', 'at', 'pol', 'ea')
  if v[1] ~= 'pending' or v[2] ~= queue then
    redis.call('ZREM', pq, rk)
    if v[1] ~= 'pending' then
      redis.call('ZREM', pd, rk)
    end
  elseif tonumber(v[3]) > now then
    redis.call('HSET', rk, 'st', IN_PROGRESS, 'f', num(next_fence(tonumber(v[4]), now)),
      'at', num(tonumber(v[5]) + 1), 'lu', num(now + lease), 'ua', num(now))
    redis.call('ZREM', pq, rk)
    redis.call('ZREM', pd, rk)
    settle(idx, rk, IN_PROGRESS, v[6], now + lease, 0, tonumber(v[7]), now, grace)
    out[#out + 1] = redis.call('HGETALL', rk)
  end
end
return out
