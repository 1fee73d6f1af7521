-- Open the fleet's breaker now, for ARGV[1] seconds before probing (Retry-After, a
-- failure-rate trip, or a replica that opened it locally while Redis was away).
-- KEYS[1] breaker hash, KEYS[2] failure count. ARGV: seconds, reset_timeout_s,
-- channel, backend. opened_at is set so that opened_at + reset_timeout is when to probe.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local probe_at = now + tonumber(ARGV[1])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local opened = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
if state == 'open' and opened + tonumber(ARGV[2]) >= probe_at then
  return {state, tostring(opened)}  -- already held at least as long
end
local opened_at = tostring(probe_at - tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', opened_at, 'updated_at', tostring(now))
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' open ' .. opened_at .. ' ' .. tostring(now))
return {'open', opened_at}
