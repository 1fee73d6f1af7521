-- Back in shared mode (bucket/redis.py): a bucket Redis lost (a restart) starts empty,
-- not full, and the calls a replica made on its own meanwhile (ARGV[3], at most one
-- burst) are charged to it. KEYS[1] the bucket's TAT; ARGV: interval, burst, calls.
local interval = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '-1')
local empty = now + tonumber(ARGV[2]) * interval
if tat < 0 then
  tat = empty
else
  if tat < now then tat = now end
  tat = math.min(tat + tonumber(ARGV[3]) * interval, empty)
end
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return 1
