-- due: the first entries of one shard's indexes, lowest score first
-- (read-only; the first phase of a sweep, reap or listing).
-- KEYS: index keys of one shard.
-- ARGV: clock, due ('' for every entry, else a lag in microseconds: only
--       entries with score <= now - lag), limit, max score ('+inf' or a
--       number), then one min score per key ('-inf' or a number)
-- Returns one {member, score, ...} list per key.
local max = ARGV[4]
if ARGV[2] ~= '' then
  local now = clock(ARGV[1]) - tonumber(ARGV[2])
  if max == '+inf' or tonumber(max) > now then
    max = num(now)
  end
end
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('ZRANGEBYSCORE', k, ARGV[4 + i], max, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
end
return out
