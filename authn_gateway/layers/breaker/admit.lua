-- Fleet admission for one call to a backend, atomically (breaker/redis.py). The state
-- moves only by the table above: 'due', when a probe gets its permit and slot.
-- KEYS[1] breaker hash (state, opened_at, updated_at), KEYS[2] in-flight set,
-- KEYS[3] half-open probe set, KEYS[4] failure count. Set members expire (score =
-- expiry, ms): a replica that dies mid-call frees its slot after the call's deadline.
-- ARGV: max_in_flight, slot_ttl_ms, member, reset_timeout_s, probes, fail_max.
-- Returns {verdict, state, opened_at}: verdict is 'ok', 'probe', 'open' or 'busy'.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = now_ms / 1000
local ttl = tonumber(ARGV[2])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local opened = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
local probe = false
if state == 'open' and now < opened + tonumber(ARGV[4]) then
  return {'open', state, tostring(opened)}
end
if state == 'open' or state == 'half-open' then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then
    return {'open', state, tostring(opened)}
  end
  probe = true
end
-- The slot comes after the state check, in the same script: no call can pass a
-- "closed" check and go out after the breaker opened.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[1]) then
  return {'busy', state, tostring(opened)}
end
redis.call('ZADD', KEYS[2], now_ms + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[2], ttl)
if probe then
  redis.call('ZADD', KEYS[3], now_ms + ttl, ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ttl)
  -- Not published: the other replicas find it at their own admission.
  state, opened = apply(KEYS[1], KEYS[4], 'due', now, tonumber(ARGV[6]), 0)
  return {'probe', state, tostring(opened)}
end
return {'ok', state, tostring(opened)}
