-- lib.lua is prepended to every script of the store (see scripts.go).
--
-- Conventions shared by all scripts:
--   * Times and durations are integer microseconds since the Unix epoch. Lua
--     numbers are doubles, exact up to 2^53 (year 2255 in microseconds).
--   * The clock argument is '' to use the Redis server's TIME, else the time
--     passed by the caller (an injected clock).
--   * Scripts that change one record get KEYS = {lease, unknown, term, open,
--     dead, record}; batch scripts get the five index keys followed by
--     records. All of them share one hash slot (the record's index shard).

-- idx holds the shard's index keys that open KEYS (see settle) in every
-- script but due.lua; REC is the position in KEYS of the first key after
-- them (the record of a single-record script).
local idx = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}
local REC = 6

local IN_PROGRESS = 'in_progress'
local COMPLETED = 'completed'
local FAILED = 'failed_retryable'
local UNKNOWN = 'unknown'
local EXPIRED = 'expired'

-- num formats an integer without the exponent notation Lua 5.1 uses for
-- numbers beyond 14 digits (which would lose microseconds).
local function num(n)
  return string.format('%.0f', n)
end

local function clock(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- next_fence is store.NextFence: now (microseconds), and above prev (0 when
-- there is no record), so a fence is never handed out twice for a key, even
-- across a delete.
local function next_fence(prev, now)
  local f = now
  if f < 1 then
    f = 1
  end
  if f <= prev then
    f = prev + 1
  end
  return f
end

local function terminal(st)
  return st == COMPLETED or st == FAILED
end

-- settle makes the index memberships and the Redis TTL of a record agree
-- with its new state. Every script that changes a record calls it in the same
-- script, so the indexes are never stale.
--   lease: in_progress under policy unknown, by locked_until (sweeper)
--   unknown: unknown and not dead-lettered, by reconcile_after (reconciler)
--   term: completed and failed_retryable, by expires_at (reaper: delete)
--   open: unknown by expires_at, in_progress by the later of expires_at and
--         locked_until (reaper: abandon; a holder still renewing its lease
--         is alive and is spared)
--   dead: unknown and dead-lettered, by reconcile_after (never due; operators
--         list it with the unknown index, in one reconcile_after order)
-- Whether an unknown record is dead-lettered is read from the record, so
-- the script sets dead_lettered_at ('dla') before it settles.
local function settle(idx, rk, st, pol, lu, ra, ea, now, grace_ms)
  if st == IN_PROGRESS and pol == 'unknown' then
    redis.call('ZADD', idx[1], num(lu), rk)
  else
    redis.call('ZREM', idx[1], rk)
  end
  local dead = st == UNKNOWN and redis.call('HEXISTS', rk, 'dla') == 1
  if st == UNKNOWN and not dead then
    redis.call('ZADD', idx[2], num(ra), rk)
  else
    redis.call('ZREM', idx[2], rk)
  end
  if dead then
    redis.call('ZADD', idx[5], num(ra), rk)
  else
    redis.call('ZREM', idx[5], rk)
  end
  if terminal(st) then
    redis.call('ZADD', idx[3], num(ea), rk)
    -- The request kept for a worker may name the caller: a terminal
    -- record drops it (store.Record.Request), and the owner, which only
    -- an open execution needs (store.Record.Owner), with it.
    redis.call('HDEL', rk, 'q', 'rq', 'o')
  else
    redis.call('ZREM', idx[3], rk)
  end
  if st == IN_PROGRESS or st == UNKNOWN then
    local due = ea
    if st == IN_PROGRESS and lu > ea then
      due = lu
    end
    redis.call('ZADD', idx[4], num(due), rk)
    -- Never let Redis drop a record whose outcome is still open.
    redis.call('PERSIST', rk)
  else
    redis.call('ZREM', idx[4], rk)
    -- A terminal (or soft-expired) record outlives expires_at by the grace
    -- period even when no reaper runs; the TTL is relative so an injected
    -- clock far from the server's time cannot drop a record early.
    local left = math.floor((ea - now) / 1000)
    if left < 0 then
      left = 0
    end
    redis.call('PEXPIRE', rk, num(left + grace_ms))
  end
end

local function unindex(idx, rk)
  for i = 1, #idx do
    redis.call('ZREM', idx[i], rk)
  end
end

-- set_response stores a response from ARGV[i..i+4]:
-- status, header (JSON), body, has_body ('1' when the body is not nil),
-- body_omitted ('1'/'0').
local function set_response(rk, i)
  redis.call('HSET', rk, 'rs', ARGV[i], 'rh', ARGV[i + 1], 'ro', ARGV[i + 4])
  if ARGV[i + 3] == '1' then
    redis.call('HSET', rk, 'rb', ARGV[i + 2])
  else
    redis.call('HDEL', rk, 'rb')
  end
end
