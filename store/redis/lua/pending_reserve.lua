-- pending_reserve: store.Queue.ReservePending, the rules of reserve.lua
-- except that the caller never holds a lease: where reserve would create,
-- reclaim or take over, the record becomes pending with the request, in
-- the queue index of its queue (by created_at, the claim order) and the
-- pending deadline index (by locked_until, the claim deadline).
-- KEYS: the shard's index keys, the record, the queue index, the
-- pending deadline index.
-- ARGV: clock, scope, key, fingerprint, wait_us, ttl_us, policy, grace_ms,
-- queue, request
-- Returns {outcome, HGETALL} (0 existing, 1 created, 2 reclaimed, 3 taken
-- over).
local PENDING = 'pending'
local rk, pq, pd = KEYS[REC], KEYS[REC + 1], KEYS[REC + 2]
local now = clock(ARGV[1])
local scope, key, fp = ARGV[2], ARGV[3], ARGV[4]
local wait, ttl, pol, grace = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local queue, request = ARGV[9], ARGV[10]

local all = redis.call('HGETALL', rk)
local r = {}
for i = 1, #all, 2 do
  r[all[i]] = all[i + 1]
end
local st, rfp, fence, rpol = r.st, r.fp, tonumber(r.f), r.pol
local lu, ea = tonumber(r.lu), tonumber(r.ea)

local function result(outcome)
  return {outcome, redis.call('HGETALL', rk)}
end

-- queued files the record in the pending indexes; a pending record never
-- expires by TTL (ExpirePending ends it).
local function queued(ca)
  unindex(idx, rk)
  redis.call('PERSIST', rk)
  redis.call('ZADD', pq, num(ca), rk)
  redis.call('ZADD', pd, num(now + wait), rk)
end

if not st or st == EXPIRED or (terminal(st) and ea <= now) then
  local f = next_fence(0, now)
  if st then
    f = next_fence(fence, now)
    redis.call('DEL', rk)
  end
  redis.call('HSET', rk, 's', scope, 'k', key, 'fp', fp, 'st', PENDING, 'f', num(f),
    'pol', pol, 'lu', num(now + wait), 'rp', '', 'le', '', 'at', '0',
    'ca', num(now), 'ua', num(now), 'ea', num(now + ttl), 'rat', '0', 'q', queue, 'rq', request)
  queued(now)
  return result(1)
end

if rfp ~= fp then
  return {0, all}
end

local outcome
if st == FAILED then
  outcome = 2
  redis.call('HSET', rk, 'ea', num(now + ttl))
elseif st == IN_PROGRESS and lu <= now then
  if rpol == 'unknown' then
    redis.call('HSET', rk, 'st', UNKNOWN, 'ra', num(now), 'le', 'lease_expired', 'ua', num(now))
    settle(idx, rk, UNKNOWN, rpol, lu, now, ea, now, grace)
    return result(0)
  end
  outcome = 3
else
  return {0, all}
end
redis.call('HSET', rk, 'st', PENDING, 'f', num(next_fence(fence, now)), 'lu', num(now + wait),
  'le', '', 'rat', '0', 'ua', num(now), 'q', queue, 'rq', request)
-- The execution a worker will run is no Reserve's: it has no owner
-- (store.Record.Owner), whatever the record held.
redis.call('HDEL', rk, 'ra', 'rs', 'rh', 'rb', 'ro', 'cpa', 'o')
queued(tonumber(r.ca))
return result(outcome)
