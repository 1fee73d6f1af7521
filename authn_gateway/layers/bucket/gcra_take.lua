-- GCRA (see bucket/gcra.py), atomically, with Redis' clock so replicas agree on "now".
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval
local wait = new_tat - burst * interval - now
if wait > max_wait + 1e-9 then return '-1' end
redis.call('SET', KEYS[1], string.format('%.6f', new_tat), 'PX',
           math.ceil((new_tat - now) * 1000) + 1000)
if wait < 0 then wait = 0 end
return string.format('%.6f', wait)
