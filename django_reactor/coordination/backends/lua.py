"""The Lua scripts of the Redis backend: one atomic round trip per operation.

Every script reads the Redis server's clock with ``TIME`` (allowed before writes since Redis 5
replicates scripts by their effects). Numbers are formatted with ``%.0f`` because Lua 5.1 would
print microsecond timestamps in exponent notation.
"""

from __future__ import annotations

_CLOCK = """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local function fmt(n) return string.format('%.0f', n) end
"""

# KEYS: lock hash, fence counter. ARGV: owner, ttl ms.
# The fence is max(previous + 1, server microseconds): strictly increasing per key, and still
# larger than every earlier fence if the counter key is lost (restart, failover, flush).
LOCK_ACQUIRE = (
    _CLOCK
    + """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('HGET', KEYS[1], 'fence')}
end
if owner then return false end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = fmt(math.max(last + 1, now_us))
redis.call('SET', KEYS[2], fence)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0, fence}
"""
)

# KEYS: lock hash. ARGV: owner, ttl ms.
LOCK_EXTEND = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: lock hash. ARGV: owner.
LOCK_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# A semaphore is a sorted set of owner -> expiry (server ms); the key itself expires with its
# last holder.
_SEM_TRIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now_ms))
local function expire_with_last()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', KEYS[1], fmt(tonumber(last[2]) - now_ms + 1)) end
end
"""

# KEYS: semaphore zset. ARGV: owner, limit, ttl ms. Returns {reentered, holders} or nil.
SEM_ACQUIRE = (
    _CLOCK
    + _SEM_TRIM
    + """
local reentered = 0
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  reentered = 1
elseif redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return false
end
redis.call('ZADD', KEYS[1], fmt(now_ms + tonumber(ARGV[3])), ARGV[1])
expire_with_last()
return {reentered, redis.call('ZCARD', KEYS[1])}
"""
)

# KEYS: semaphore zset. ARGV: owner, ttl ms.
SEM_EXTEND = (
    _CLOCK
    + _SEM_TRIM
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', fmt(now_ms + tonumber(ARGV[2])), ARGV[1])
expire_with_last()
return 1
"""
)

# KEYS: semaphore zset. ARGV: owner.
SEM_RELEASE = (
    _CLOCK
    + _SEM_TRIM
    + """
return redis.call('ZREM', KEYS[1], ARGV[1])
"""
)

# KEYS: semaphore zset. Live holders, soonest expiry first.
SEM_HOLDERS = (
    _CLOCK
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now_ms), '+inf')
"""
)

# Sliding-window log. KEYS: log zset (member per unit of cost, score = server us), sequence.
# ARGV: cost, n, then n pairs of limit and period us. Returns
# {allowed, retry_after us, limiting window (1-based, 0 if none), now us, count_1..count_n}.
RATE_CHECK = (
    _CLOCK
    + """
local cost = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local longest = 0
for i = 1, n do
  local p = tonumber(ARGV[2 + 2 * i])
  if p > longest then longest = p end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now_us - longest))
local counts = {}
local allowed = 1
local retry = 0
local limiting = 0
for i = 1, n do
  local limit = tonumber(ARGV[1 + 2 * i])
  local p = tonumber(ARGV[2 + 2 * i])
  local since = '(' .. fmt(now_us - p)
  local c = redis.call('ZCOUNT', KEYS[1], since, '+inf')
  counts[i] = c
  if c + cost > limit then
    allowed = 0
    -- The (c + cost - limit)-th oldest charge in the window must leave it first.
    local blocker = redis.call('ZRANGEBYSCORE', KEYS[1], since, '+inf', 'WITHSCORES',
      'LIMIT', c + cost - limit - 1, 1)
    local wait = tonumber(blocker[2]) + p - now_us
    if wait > retry then
      retry = wait
      limiting = i
    end
  end
end
if allowed == 1 then
  local seq = redis.call('INCRBY', KEYS[2], cost)
  for j = 1, cost do
    redis.call('ZADD', KEYS[1], fmt(now_us), fmt(now_us) .. ':' .. fmt(seq - cost + j))
  end
  local keep = fmt(math.ceil(longest / 1000) + 1)
  redis.call('PEXPIRE', KEYS[1], keep)
  redis.call('PEXPIRE', KEYS[2], keep)
  for i = 1, n do counts[i] = counts[i] + cost end
end
local reply = {allowed, fmt(retry), limiting, fmt(now_us)}
for i = 1, n do reply[4 + i] = counts[i] end
return reply
"""
)

# KEYS: log zset. ARGV: period us.
RATE_COUNT = (
    _CLOCK
    + """
return redis.call('ZCOUNT', KEYS[1], '(' .. fmt(now_us - tonumber(ARGV[1])), '+inf')
"""
)

# A period bucket is a hash {owner, state}; a reservation expires, a claim is kept keep_for.
# KEYS: bucket hash. ARGV: owner, ttl ms. Returns {granted, holder, state}.
PERIOD_RESERVE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'reserved')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, ARGV[1], 'reserved'}
end
local state = redis.call('HGET', KEYS[1], 'state')
if owner ~= ARGV[1] then return {0, owner, state} end
if state == 'reserved' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return {1, owner, state}
"""

# KEYS: bucket hash. ARGV: owner, keep_for ms.
PERIOD_CONFIRM = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'claimed')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: bucket hash. ARGV: owner.
PERIOD_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'reserved' then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# Ordered locks. KEYS: queue zset (owner -> enqueue sequence), state hash (seq, head, since
# us, halted), skipped list. The head's "since" is stamped whenever the head changes.
_ORDERED = (
    _CLOCK
    + """
local function refresh_head()
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not first then
    redis.call('HDEL', KEYS[2], 'head', 'since')
    return nil
  end
  if redis.call('HGET', KEYS[2], 'head') ~= first then
    redis.call('HSET', KEYS[2], 'head', first, 'since', fmt(now_us))
  end
  return first
end
local function remember_skip(owner, kept)
  redis.call('RPUSH', KEYS[3], owner)
  redis.call('LTRIM', KEYS[3], -kept, -1)
end
"""
)

# ARGV: owner. Returns the position.
ORDERED_ENQUEUE = (
    _ORDERED
    + """
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then return rank end
local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('ZADD', KEYS[1], seq, ARGV[1])
refresh_head()
return redis.call('ZRANK', KEYS[1], ARGV[1])
"""
)

# ARGV: poison_after us, skipped kept. Returns {head or false, skipped owners...}.
ORDERED_HEAD = (
    _ORDERED
    + """
if redis.call('HGET', KEYS[2], 'halted') then return {false} end
local reply = {false}
while true do
  local head = refresh_head()
  if not head then return reply end
  local since = tonumber(redis.call('HGET', KEYS[2], 'since'))
  if now_us - since <= tonumber(ARGV[1]) then
    reply[1] = head
    return reply
  end
  redis.call('ZREM', KEYS[1], head)
  remember_skip(head, tonumber(ARGV[2]))
  table.insert(reply, head)
end
"""
)

# ARGV: owner.
ORDERED_HEARTBEAT = (
    _ORDERED
    + """
if refresh_head() ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'since', fmt(now_us))
return 1
"""
)

# ARGV: owner, halt (1 when failed and strict).
ORDERED_COMPLETE = (
    _ORDERED
    + """
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 and ARGV[2] == '1' then
  redis.call('HSETNX', KEYS[2], 'halted', ARGV[1])
end
refresh_head()
return removed
"""
)

# ARGV: owner, skipped kept.
ORDERED_SKIP = (
    _ORDERED
    + """
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 then remember_skip(ARGV[1], tonumber(ARGV[2])) end
refresh_head()
return removed
"""
)

ORDERED_RESET = """
local n = redis.call('ZCARD', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return n
"""

# Returns {queue, since us or false, halted or false, skipped}.
ORDERED_STATUS = """
return {
  redis.call('ZRANGE', KEYS[1], 0, -1),
  redis.call('HGET', KEYS[2], 'since'),
  redis.call('HGET', KEYS[2], 'halted'),
  redis.call('LRANGE', KEYS[3], 0, -1),
}
"""
