-- A bucket shared between clusters by weight: bucket/fair.py's fair_gcra, step for step
-- (tests/process/test_stores.py holds the two to the same answers), atomically, on
-- Redis' clock. KEYS[1..n] each share's TAT; KEYS[n+1..2n] each cluster's borrowing, a
-- hash of its pass (p) and when it last asked to borrow (a).
-- ARGV: tau (B/R), max_wait, own (0-based; -1: a follow-up call, of no cluster), then n
-- intervals, then n weights. Returns {wait, charged share} or {'-1', -1} when refused.
local tau = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local own = tonumber(ARGV[3])
local n = #KEYS / 2
local eps = 1e-9
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local keep_ms = math.ceil(tau * 1000) + 1000

local tats, intervals, weights = {}, {}, {}
for j = 0, n - 1 do
  local tat = tonumber(redis.call('GET', KEYS[1 + j]) or '0')
  if tat < now then tat = now end
  tats[j] = tat
  intervals[j] = tonumber(ARGV[4 + j])
  weights[j] = tonumber(ARGV[4 + n + j])
end

local function tolerance(j)
  return math.max(tau, intervals[j])
end

local function spend(j, wait)
  local after = tats[j] + intervals[j]
  redis.call('SET', KEYS[1 + j], string.format('%.6f', after), 'PX',
             math.ceil((after - now) * 1000) + 1000)
  return {string.format('%.6f', math.max(0, wait)), j}
end

if own < 0 then
  local fullest, best = 0, nil
  for j = 0, n - 1 do
    local wait = tats[j] + intervals[j] - tolerance(j) - now
    if best == nil or wait < best then fullest, best = j, wait end
  end
  if best > max_wait + eps then return {'-1', -1} end
  return spend(fullest, best)
end

local own_wait = tats[own] + intervals[own] - tolerance(own) - now
if own_wait <= max_wait + eps then return spend(own, own_wait) end

-- Among the clusters borrowing now, loans go by weight.
local recent = now - tau / 2
local passes, asked = {}, {}
for j = 0, n - 1 do
  local v = redis.call('HMGET', KEYS[1 + n + j], 'p', 'a')
  passes[j] = tonumber(v[1] or '0')
  asked[j] = tonumber(v[2] or '-1e18')
end
local floor = nil
for j = 0, n - 1 do
  if j ~= own and asked[j] >= recent and (floor == nil or passes[j] < floor) then
    floor = passes[j]
  end
end
local mine = passes[own]
if asked[own] < recent and floor ~= nil then mine = floor end
local lender, best = -1, 0
for j = 0, n - 1 do
  if j ~= own then
    local margin = tats[j] + intervals[j] - now - tolerance(j) / 2
    if margin <= eps and (lender < 0 or margin < best) then lender, best = j, margin end
  end
end
local refused = lender < 0 or (floor ~= nil and mine > floor + 1 / weights[own] + eps)
if not refused then mine = mine + 1 / weights[own] end
redis.call('HSET', KEYS[1 + n + own], 'p', string.format('%.17g', mine),
           'a', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1 + n + own], keep_ms)
if refused then return {'-1', -1} end
return spend(lender, 0)
