-- wrk script for POST /v1/payments. Configured by the environment:
--   BENCH_MODE       new (a fresh UUID v4 key per request), replay (keys from BENCH_KEYS_FILE,
--                    chosen at random, each with the body it was created with) or mix (50/50)
--   BENCH_API_KEY    the account's secret key
--   BENCH_KEYS_FILE  lines "key amount" of keys created beforehand (replay and mix)
-- done() prints one line "BENCH_JSON {...}": requests, rate, latency percentiles, and the answers
-- counted by status and by the Idempotent-Replayed header, so that an error or a replay where a
-- new key was meant never passes for throughput.

local mode = os.getenv("BENCH_MODE") or "new"
local api_key = os.getenv("BENCH_API_KEY") or error("BENCH_API_KEY is not set")
local keys_file = os.getenv("BENCH_KEYS_FILE")

local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("thread_no", counter)
  table.insert(threads, thread)
end

-- Per-thread counters, read by done() through thread:get.
sent_new, sent_replay = 0, 0
answers, status_2xx, replayed = 0, 0, 0
status_409, status_422, status_4xx, status_5xx, status_other = 0, 0, 0, 0, 0
first_error = ""

local replay_keys = {}
local new_body = '{"amount":1000,"currency":"eur","payment_method":"pm_card_visa"}'

local function seed_random()
  local seed = os.time() + (thread_no or 0) * 7919
  local f = io.open("/dev/urandom", "rb")
  if f then
    local bytes = f:read(4)
    f:close()
    seed = seed + bytes:byte(1) + bytes:byte(2) * 256 + bytes:byte(3) * 65536 + bytes:byte(4) * 16777216
  end
  math.randomseed(seed)
  -- The first values after seeding are poorly mixed in some Lua versions.
  for _ = 1, 10 do math.random() end
end

local function uuid_v4()
  local r = math.random
  return string.format("%04x%04x-%04x-4%03x-%x%03x-%04x%04x%04x",
    r(0, 0xffff), r(0, 0xffff), r(0, 0xffff), r(0, 0xfff), r(8, 11), r(0, 0xfff),
    r(0, 0xffff), r(0, 0xffff), r(0, 0xffff))
end

local function headers_for(key)
  return {
    ["Authorization"] = "Bearer " .. api_key,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }
end

function init(args)
  seed_random()
  if mode == "replay" or mode == "mix" then
    assert(keys_file, "BENCH_KEYS_FILE is not set")
    for line in io.lines(keys_file) do
      local key, amount = line:match("^(%S+)%s+(%d+)$")
      if key then
        table.insert(replay_keys, {
          key = key,
          body = '{"amount":' .. amount .. ',"currency":"eur","payment_method":"pm_card_visa"}',
        })
      end
    end
    assert(#replay_keys > 0, "no keys in " .. keys_file)
  end
end

local function new_request()
  sent_new = sent_new + 1
  return wrk.format("POST", nil, headers_for(uuid_v4()), new_body)
end

local function replay_request()
  sent_replay = sent_replay + 1
  local entry = replay_keys[math.random(1, #replay_keys)]
  return wrk.format("POST", nil, headers_for(entry.key), entry.body)
end

function request()
  if mode == "new" then
    return new_request()
  elseif mode == "replay" then
    return replay_request()
  elseif math.random() < 0.5 then
    return new_request()
  else
    return replay_request()
  end
end

function response(status, headers, body)
  answers = answers + 1
  if status >= 200 and status < 300 then
    status_2xx = status_2xx + 1
  elseif status == 409 then
    status_409 = status_409 + 1
  elseif status == 422 then
    status_422 = status_422 + 1
  elseif status >= 400 and status < 500 then
    status_4xx = status_4xx + 1
  elseif status >= 500 then
    status_5xx = status_5xx + 1
  else
    status_other = status_other + 1
  end
  if (status < 200 or status >= 300) and first_error == "" then
    first_error = status .. " " .. string.sub(body or "", 1, 300)
  end
  if headers["idempotent-replayed"] == "true" or headers["Idempotent-Replayed"] == "true" then
    replayed = replayed + 1
  end
end

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
end

function done(summary, latency, requests)
  local totals = {}
  local names = { "sent_new", "sent_replay", "answers", "status_2xx", "replayed", "status_409",
    "status_422", "status_4xx", "status_5xx", "status_other" }
  for _, name in ipairs(names) do totals[name] = 0 end
  local err = ""
  for _, thread in ipairs(threads) do
    for _, name in ipairs(names) do
      totals[name] = totals[name] + (tonumber(thread:get(name)) or 0)
    end
    local e = thread:get("first_error")
    if err == "" and e and e ~= "" then err = e end
  end
  local seconds = summary.duration / 1e6
  local parts = {
    string.format('"mode":%s', json_string(mode)),
    string.format('"requests":%d', summary.requests),
    string.format('"duration_s":%.3f', seconds),
    string.format('"rps":%.1f', summary.requests / seconds),
    string.format('"p50_ms":%.3f', latency:percentile(50) / 1000),
    string.format('"p90_ms":%.3f', latency:percentile(90) / 1000),
    string.format('"p99_ms":%.3f', latency:percentile(99) / 1000),
    string.format('"p999_ms":%.3f', latency:percentile(99.9) / 1000),
    string.format('"max_ms":%.3f', latency.max / 1000),
    string.format('"mean_ms":%.3f', latency.mean / 1000),
    -- wrk's own count of answers with a status above 399, and socket errors.
    string.format('"non_2xx_3xx":%d', summary.errors.status),
    string.format('"socket_errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d}',
      summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout),
    string.format('"first_error":%s', json_string(err)),
  }
  for _, name in ipairs(names) do
    table.insert(parts, string.format('"%s":%d', name, totals[name]))
  end
  table.insert(parts, string.format('"non_2xx":%d', totals.answers - totals.status_2xx))
  io.write("BENCH_JSON {" .. table.concat(parts, ",") .. "}\n")
end
