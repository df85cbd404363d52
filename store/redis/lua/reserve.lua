-- reserve: the single atomic entry point of a request (store.Store.Reserve).
-- ARGV: clock, scope, key, fingerprint, lease_us, ttl_us, policy, grace_ms,
-- owner
-- Returns {outcome, HGETALL}; outcome follows store.ReserveOutcome
-- (0 existing, 1 created, 2 reclaimed, 3 taken over).
local rk = KEYS[REC]
local now = clock(ARGV[1])
local scope, key, fp = ARGV[2], ARGV[3], ARGV[4]
local lease, ttl, pol, grace = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
-- owner (store.Record.Owner) is written by every branch that starts an
-- execution, and only by them. It stays the caller's decimal string: any
-- int64, which a Lua number (a double) would round.
local owner = ARGV[9]

-- One read of the whole record: a replay returns it as read.
local all = redis.call('HGETALL', rk)
local r = {}
for i = 1, #all, 2 do
  r[all[i]] = all[i + 1]
end
local st, rfp, fence, rpol = r.st, r.fp, tonumber(r.f), r.pol
local lu, ea, at = tonumber(r.lu), tonumber(r.ea), tonumber(r.at)

local function result(outcome)
  return {outcome, redis.call('HGETALL', rk)}
end

if not st or st == EXPIRED or (terminal(st) and ea <= now) then
  local f = next_fence(0, now)
  if st then
    -- Above the expired record's fence, so a zombie holder of the previous
    -- generation can never complete the new one.
    f = next_fence(fence, now)
    redis.call('DEL', rk)
  else
    -- A new index entry: drop up to two entries of the terminal index whose
    -- record Redis already evicted by TTL (expires_at + grace is past), so
    -- the index stays bounded even when no reaper runs. The entries are
    -- records of this shard, so in this slot: reading them though they are
    -- not in KEYS is allowed (the scripts declare no flags, so Redis 7 runs
    -- them in compatibility mode, and Cluster only requires one slot).
    local stale = redis.call('ZRANGEBYSCORE', idx[3], '-inf', num(now - grace * 1000), 'LIMIT', 0, 2)
    for _, m in ipairs(stale) do
      if redis.call('EXISTS', m) == 0 then
        redis.call('ZREM', idx[3], m)
      end
    end
  end
  redis.call('HSET', rk, 's', scope, 'k', key, 'fp', fp, 'st', IN_PROGRESS, 'f', num(f),
    'pol', pol, 'lu', num(now + lease), 'rp', '', 'le', '', 'at', '1',
    'ca', num(now), 'ua', num(now), 'ea', num(now + ttl), 'rat', '0', 'o', owner)
  settle(idx, rk, IN_PROGRESS, pol, now + lease, 0, now + ttl, now, grace)
  return result(1)
end

if rfp ~= fp then
  return {0, all}
end

if st == FAILED then
  -- The policy stays the one fixed when the record was created.
  redis.call('HSET', rk, 'st', IN_PROGRESS, 'f', num(next_fence(fence, now)), 'at', num(at + 1),
    'lu', num(now + lease), 'ea', num(now + ttl), 'le', '', 'rat', '0', 'ua', num(now), 'o', owner)
  redis.call('HDEL', rk, 'ra')
  settle(idx, rk, IN_PROGRESS, rpol, now + lease, 0, now + ttl, now, grace)
  return result(2)
end

if st == IN_PROGRESS and lu <= now then
  if rpol == 'unknown' then
    redis.call('HSET', rk, 'st', UNKNOWN, 'ra', num(now), 'le', 'lease_expired', 'ua', num(now))
    settle(idx, rk, UNKNOWN, rpol, lu, now, ea, now, grace)
    return result(0)
  end
  -- retry / resume: a new fence; recovery_point is kept for resume.
  redis.call('HSET', rk, 'f', num(next_fence(fence, now)), 'at', num(at + 1), 'lu', num(now + lease), 'le', '', 'rat', '0', 'ua', num(now),
    'o', owner)
  settle(idx, rk, IN_PROGRESS, rpol, now + lease, 0, ea, now, grace)
  return result(3)
end

return {0, all}
