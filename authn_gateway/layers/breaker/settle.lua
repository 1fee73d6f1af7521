-- One admitted call is over (breaker/redis.py): free its slot and apply its outcome by
-- the table above, in one script, so a slot is only freed once its failure is counted.
-- KEYS[1] breaker hash, KEYS[2] in-flight set, KEYS[3] probe set, KEYS[4] failure count.
-- ARGV: member, outcome ('ok', 'fail' or 'none': never made), fail_max, probe (0/1),
--       channel, backend name.
-- A move is published as "backend state opened_at published_at": replicas adopt it
-- without a poll. Returns {state, opened_at} after the call.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREM', KEYS[2], ARGV[1])
local probe = ARGV[4] == '1'
if probe then redis.call('ZREM', KEYS[3], ARGV[1]) end
-- The table's events: ok, fail, probe_ok, probe_fail, or release for 'none'.
local event = 'release'
if ARGV[2] ~= 'none' then
  event = ARGV[2]
  if probe then event = 'probe_' .. event end
end
local state, opened, moved = apply(KEYS[1], KEYS[4], event, now, tonumber(ARGV[3]), 0)
if moved then
  redis.call('PUBLISH', ARGV[5],
    ARGV[6] .. ' ' .. state .. ' ' .. tostring(opened) .. ' ' .. tostring(now))
end
return {state, tostring(opened)}
