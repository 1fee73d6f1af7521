-- Newest write wins, so a slow replica cannot roll the fleet back to an old state.
local current = tonumber(redis.call('HGET', KEYS[1], 'updated_at') or '0')
if tonumber(ARGV[3]) > current then
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'opened_at', ARGV[2], 'updated_at', ARGV[3])
  return 1
end
return 0
