-- Set or clear one backend's operator override for the fleet (breaker/override.py).
-- KEYS[1] override hash (override, since, expires_at, by), in the breaker's hash slot.
-- ARGV: override ('forced_open', 'forced_closed' or 'none' to clear), seconds, by,
--       channel, backend.
-- The same override again renews it and keeps its start ('since'). Redis expires the
-- key at expires_at, so a forgotten override ends even if no replica is running.
-- Publishes "override backend override since expires_at published_at"; returns
-- {override, since, expires_at}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local override = ARGV[1]
local since, expires = 0, 0
if override == 'none' then
  redis.call('DEL', KEYS[1])
else
  local previous = redis.call('HMGET', KEYS[1], 'override', 'since')
  since = now
  if previous[1] == override and previous[2] then since = tonumber(previous[2]) end
  expires = now + tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'override', override, 'since', string.format('%.3f', since),
    'expires_at', string.format('%.3f', expires), 'by', ARGV[3])
  redis.call('PEXPIREAT', KEYS[1], math.ceil(expires * 1000))
end
local s, e = string.format('%.3f', since), string.format('%.3f', expires)
redis.call('PUBLISH', ARGV[4],
  'override ' .. ARGV[5] .. ' ' .. override .. ' ' .. s .. ' ' .. e .. ' ' .. string.format('%.3f', now))
return {override, s, e}
