-- Each replica's view of its breakers, for GET /admin/breakers (breaker/redis.py).
-- KEYS[1] the views hash: field = replica id, value = "<expires_ms> <json>".
-- ARGV[1] 'put' (ARGV[2] replica, ARGV[3] json, ARGV[4] ttl_ms) or 'get'.
-- Entries past their expiry (a replica that stopped publishing) are removed; 'get'
-- returns the live entries' JSON.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'put' then
  local ttl = tonumber(ARGV[4])
  redis.call('HSET', KEYS[1], ARGV[2], string.format('%d', now_ms + ttl) .. ' ' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ttl)
end
local live = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local value = entries[i + 1]
  local expires = tonumber(string.match(value, '^(%d+) ') or '0')
  if expires <= now_ms then
    redis.call('HDEL', KEYS[1], entries[i])
  elseif ARGV[1] == 'get' then
    live[#live + 1] = string.sub(value, string.find(value, ' ') + 1)
  end
end
return live
