-- Open the fleet's breaker for ARGV[1] seconds before probing (Retry-After, a
-- failure-rate or slow-call trip, or a replica that opened it locally while Redis was
-- away): the table's 'trip', which never shortens a longer hold in force.
-- KEYS[1] breaker hash, KEYS[2] failure count. ARGV: seconds, reset_timeout_s,
-- channel, backend, fail_max. opened_at is set so that opened_at + reset_timeout is
-- when to probe. Publishes a move; returns {state, opened_at}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local trip_opened = now + tonumber(ARGV[1]) - tonumber(ARGV[2])
local state, opened, moved = apply(KEYS[1], KEYS[2], 'trip', now, tonumber(ARGV[5]), trip_opened)
if moved then
  redis.call('PUBLISH', ARGV[3],
    ARGV[4] .. ' ' .. state .. ' ' .. tostring(opened) .. ' ' .. tostring(now))
end
return {state, tostring(opened)}
