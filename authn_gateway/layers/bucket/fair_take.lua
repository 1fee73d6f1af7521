-- A bucket shared between clusters by weight: bucket/fair.py's fair_gcra, step for step
-- (tests/process/test_stores.py holds the two to the same answers), atomically, on
-- Redis' clock. KEYS[1] the ceiling's TAT; KEYS[2..n+1] each share, a hash of its TAT
-- (t), its borrowing pass (p) and when it last asked to borrow (a).
-- ARGV: interval, burst, max_wait, own (0-based), then n intervals, then n weights.
-- Returns {wait, charged share} or {'-1', -1} when refused.
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local own = tonumber(ARGV[4])
local n = #KEYS - 1
local eps = 1e-9
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tau = burst * interval
local keep_ms = math.ceil(tau * 1000) + 1000

local function at_least_now(tat)
  if tat < now then return now end
  return tat
end

local ceiling = at_least_now(tonumber(redis.call('GET', KEYS[1]) or '0')) + interval
local ceiling_wait = ceiling - tau - now
if ceiling_wait > max_wait + eps then return {'-1', -1} end

local tats, passes, asked, intervals, weights = {}, {}, {}, {}, {}
for j = 0, n - 1 do
  local v = redis.call('HMGET', KEYS[2 + j], 't', 'p', 'a')
  tats[j] = tonumber(v[1] or '0')
  passes[j] = tonumber(v[2] or '0')
  asked[j] = tonumber(v[3] or '-1e18')
  intervals[j] = tonumber(ARGV[5 + j])
  weights[j] = tonumber(ARGV[5 + n + j])
end

local after = at_least_now(tats[own]) + intervals[own]
local own_wait = after - math.max(tau, intervals[own]) - now
local charged = own
if own_wait > max_wait + eps then
  -- Among the clusters borrowing now, loans go by weight.
  local recent = now - tau / 2
  local floor = nil
  for j = 0, n - 1 do
    if j ~= own and asked[j] >= recent and (floor == nil or passes[j] < floor) then
      floor = passes[j]
    end
  end
  local mine = passes[own]
  if asked[own] < recent and floor ~= nil then mine = floor end
  local function ask(pass)
    redis.call('HSET', KEYS[2 + own], 'p', string.format('%.17g', pass),
               'a', string.format('%.6f', now))
    redis.call('PEXPIRE', KEYS[2 + own], keep_ms)
  end
  charged = -1
  local best = 0
  for j = 0, n - 1 do
    if j ~= own then
      local lent = at_least_now(tats[j]) + intervals[j]
      local margin = lent - now - math.max(tau, intervals[j]) / 2
      if margin <= eps and (charged < 0 or margin < best) then
        charged, best, after = j, margin, lent
      end
    end
  end
  if charged < 0 or (floor ~= nil and mine > floor + 1 / weights[own] + eps) then
    ask(mine)
    return {'-1', -1}
  end
  ask(mine + 1 / weights[own])
  own_wait = 0
end

redis.call('SET', KEYS[1], string.format('%.6f', ceiling), 'PX',
           math.ceil((ceiling - now) * 1000) + 1000)
redis.call('HSET', KEYS[2 + charged], 't', string.format('%.6f', after))
redis.call('PEXPIRE', KEYS[2 + charged], keep_ms)
return {string.format('%.6f', math.max(0, ceiling_wait, own_wait)), charged}
