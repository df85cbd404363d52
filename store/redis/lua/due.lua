-- due: the first entries of one shard's indexes, lowest score first
-- (read-only; the first phase of a sweep, reap or listing).
-- KEYS: index keys of one shard. ARGV: clock, due ('1': score <= now), limit
-- Returns one {member, score, ...} list per key.
local max = '+inf'
if ARGV[2] == '1' then
  max = num(clock(ARGV[1]))
end
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('ZRANGEBYSCORE', k, '-inf', max, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
end
return out
