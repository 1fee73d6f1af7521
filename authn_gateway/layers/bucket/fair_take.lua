-- A bucket shared between clusters by weight: bucket/fair.py's fair_gcra, step for step
-- (tests/process/test_stores.py holds the two to the same answers), atomically, on
-- Redis' clock. KEYS[1..n] each share's TAT; KEYS[n+1..2n] each cluster's borrowing, a
-- hash of its pass (p), when it last asked to borrow (a) and the TAT of its calls at
-- its share's rate (c).
-- ARGV: tau (B/R), max_wait, own (0-based; -1: a follow-up call, of no cluster), then n
-- intervals, then n weights. Returns {wait, the share that paid most} or {'-1', -1}
-- when refused.
local tau = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local own = tonumber(ARGV[3])
local n = #KEYS / 2
local eps = 1e-9
local eps_calls = 1e-6  -- fair.py's CALL_EPSILON
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local tats, before, intervals, weights = {}, {}, {}, {}
for j = 0, n - 1 do
  local tat = tonumber(redis.call('GET', KEYS[1 + j]) or '0')
  if tat < now then tat = now end
  tats[j], before[j] = tat, tat
  intervals[j] = tonumber(ARGV[4 + j])
  weights[j] = tonumber(ARGV[4 + n + j])
end

-- shape(): the tolerance, at least one call of the whole bucket, and the part kept.
local rate = 0.0
for j = 0, n - 1 do rate = rate + 1.0 / intervals[j] end
tau = math.max(tau, 1.0 / rate)
local keep = 0.0
if n > 1 then keep = math.min(0.5, math.max(0.0, 1.0 - 1.0 / (tau * rate))) end
local surplus_at = now + tau * (1.0 - keep)

local function save()
  for j = 0, n - 1 do
    if tats[j] ~= before[j] then
      redis.call('SET', KEYS[1 + j], string.format('%.17g', tats[j]), 'PX',
                 math.ceil((tats[j] - now) * 1000) + 1000)
    end
  end
end

-- _draw(): up to need calls from the shares other than skip, each down to the TAT
-- limit, the fullest first. What is still needed, and the first share that gave.
local function draw(skip, need, limit)
  local have = {}
  for j = 0, n - 1 do
    if j ~= skip then
      local calls = (limit - tats[j]) / intervals[j]
      if calls > eps_calls then have[#have + 1] = {calls, j} end
    end
  end
  table.sort(have, function(x, y)
    if x[1] ~= y[1] then return x[1] > y[1] end
    return x[2] < y[2]
  end)
  local first = -1
  for _, h in ipairs(have) do
    if need <= eps_calls then break end
    local part = math.min(h[1], need)
    tats[h[2]] = tats[h[2]] + part * intervals[h[2]]
    need = need - part
    if first < 0 then first = h[2] end
  end
  return need, first
end

local function refused() return {'-1', -1} end

if own < 0 then
  local need, first = draw(-1, 1.0, surplus_at)
  if need > eps_calls then
    local more
    need, more = draw(-1, need, now + tau)
    if first < 0 then first = more end
  end
  if need <= eps_calls then
    tats[first] = tats[first] + need * intervals[first]
    save()
    return {'0', first}
  end
  -- Not enough in all the shares together: the fullest one, waited for.
  local fullest, best = 0, nil
  for j = 0, n - 1 do
    local after = before[j] + intervals[j]
    if best == nil or after < best then fullest, best = j, after end
  end
  local wait = best - tau - now
  if wait > max_wait + eps then return refused() end
  for j = 0, n - 1 do tats[j] = before[j] end
  tats[fullest] = best
  save()
  return {string.format('%.6f', math.max(0, wait)), fullest}
end

local v = redis.call('HMGET', KEYS[1 + n + own], 'p', 'a', 'c')
local my_pass = tonumber(v[1] or '0')
local my_asked = tonumber(v[2] or '-1e18')
local my_credit = tonumber(v[3] or '0')
local recent = now - tau / 2
local quiet = my_asked < recent
local own_interval = intervals[own]
local own_at = surplus_at
if quiet then own_at = now + tau end
local tolerance = math.max(tau * keep, own_interval)
local credit_at = math.max(my_credit, now)
local entitled = credit_at + own_interval - tolerance <= now + eps
local credit = math.min(credit_at + own_interval, now + tolerance)

local function keep_borrowing(pass, asked)
  local fields = {'c', string.format('%.17g', credit)}
  if pass ~= nil then
    fields[#fields + 1] = 'p'
    fields[#fields + 1] = string.format('%.17g', pass)
  end
  if asked then
    fields[#fields + 1] = 'a'
    fields[#fields + 1] = string.format('%.6f', now)
  end
  redis.call('HSET', KEYS[1 + n + own], unpack(fields))
  local keep_ms = math.max(math.ceil(tau * 1000), math.ceil((credit - now) * 1000)) + 1000
  redis.call('PEXPIRE', KEYS[1 + n + own], keep_ms)
end

local mine = tats[own] + own_interval
local own_wait = mine - own_at
if own_wait <= max_wait + eps then
  tats[own] = mine
  save()
  local pass = nil
  if not quiet then pass = my_pass + 1 / weights[own] end
  keep_borrowing(pass, false)
  return {string.format('%.6f', math.max(0, own_wait)), own}
end

-- Among the clusters borrowing now, loans go by weight.
local floor = nil
for j = 0, n - 1 do
  if j ~= own then
    local o = redis.call('HMGET', KEYS[1 + n + j], 'p', 'a')
    local p, a = tonumber(o[1] or '0'), tonumber(o[2] or '-1e18')
    if a >= recent and (floor == nil or p < floor) then floor = p end
  end
end
if quiet and floor ~= nil then my_pass = floor end
local privileged = quiet and entitled

local function refuse()
  -- Asked, and refused: the pass and the ask recorded, the entitlement untouched.
  credit = my_credit
  keep_borrowing(my_pass, true)
  return refused()
end

if not privileged and floor ~= nil and my_pass > floor + 1 / weights[own] + eps then
  return refuse()
end
local mine_part = math.max(0.0, (own_at - tats[own]) / own_interval)
local need, first = draw(own, 1.0 - mine_part, surplus_at)
if need > eps_calls and privileged then
  local more
  need, more = draw(own, need, now + tau)
  if first < 0 then first = more end
end
if need > eps_calls then return refuse() end
local payer = first
if payer < 0 then payer = own end
tats[own] = tats[own] + mine_part * own_interval
tats[payer] = tats[payer] + need * intervals[payer]
save()
keep_borrowing(my_pass + 1 / weights[own], true)
return {'0', payer}
