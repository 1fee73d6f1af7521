-- One admitted call is over (breaker/redis.py): free its slot and count its outcome
-- fleet-wide, in one script, so a slot is only freed once its failure is counted.
-- KEYS[1] breaker hash, KEYS[2] in-flight set, KEYS[3] probe set, KEYS[4] failure count.
-- ARGV: member, outcome ('ok', 'fail' or 'none': never made), fail_max, probe (0/1),
--       channel, backend name.
-- Returns {state, opened_at} after the call.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREM', KEYS[2], ARGV[1])
local probe = ARGV[4] == '1'
if probe then redis.call('ZREM', KEYS[3], ARGV[1]) end
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local opened = redis.call('HGET', KEYS[1], 'opened_at') or '0'

local function move(to, opened_at)
  redis.call('HSET', KEYS[1], 'state', to, 'opened_at', opened_at, 'updated_at', tostring(now))
  redis.call('DEL', KEYS[4])
  -- "backend state opened_at published_at": replicas adopt it without a poll.
  redis.call('PUBLISH', ARGV[5], ARGV[6] .. ' ' .. to .. ' ' .. opened_at .. ' ' .. tostring(now))
  return {to, opened_at}
end

local outcome = ARGV[2]
if outcome == 'none' then return {state, opened} end
if outcome == 'ok' then
  redis.call('DEL', KEYS[4])
  if probe and state == 'half-open' then return move('closed', '0') end
  return {state, opened}
end
-- A failure.
if probe then return move('open', tostring(now)) end
if state ~= 'closed' then
  -- A call admitted before the breaker opened, failing after: already counted for.
  return {state, opened}
end
local failures = redis.call('INCR', KEYS[4])
-- Consecutive failures, fleet-wide; the TTL only collects a forgotten key.
redis.call('EXPIRE', KEYS[4], 3600)
if failures >= tonumber(ARGV[3]) then return move('open', tostring(now)) end
return {state, opened}
