-- The breaker's state machine on Redis: breaker/transitions.py's step(), over ROWS, its
-- TABLE rendered just above this line by transitions.lua_rows(). breaker/redis.py puts
-- both in front of admit.lua, settle.lua and hold.lua, so the three scripts and the
-- in-process breaker follow one table (tests/test_breaker_transitions.py checks it).

-- Where one event leaves the breaker: state, failures, opened_at.
local function step(state, event, failures, opened, now, fail_max, trip_opened)
  local row = ROWS[state .. ' ' .. event]
  local to, count, stamp = row[1], row[2], row[3]
  if count == 'add' then
    failures = failures + 1
    if failures >= fail_max then to, failures, stamp = 'open', 0, 'now' end
  elseif count == 'reset' then
    failures = 0
  end
  if stamp == 'now' then
    opened = now
  elseif stamp == 'trip' and not (state == 'open' and opened >= trip_opened) then
    opened = trip_opened
  end
  return to, failures, opened
end

-- Apply one event to a breaker hash (state, opened_at, updated_at) and its failure
-- count. Returns the state, opened_at, and whether either changed (a move that the
-- other replicas hear of, when the script publishes it).
local function apply(hash, count_key, event, now, fail_max, trip_opened)
  local fields = redis.call('HMGET', hash, 'state', 'opened_at')
  local state = fields[1] or 'closed'
  local opened = tonumber(fields[2] or '0')
  local failures = tonumber(redis.call('GET', count_key) or '0')
  local to, count, at = step(state, event, failures, opened, now, fail_max, trip_opened)
  if count ~= failures then
    if count == 0 then
      redis.call('DEL', count_key)
    else
      -- Consecutive failures, fleet-wide; the TTL only collects a forgotten key.
      redis.call('SET', count_key, count, 'EX', 3600)
    end
  end
  local moved = to ~= state or at ~= opened
  if moved then
    redis.call('HSET', hash, 'state', to, 'opened_at', tostring(at), 'updated_at', tostring(now))
  end
  return to, at, moved
end
