-- wrk script: each connection writes DEPTH (default 16) `POST /o/counter/<OBJECT>` at once
-- and reads their answers before writing the next DEPTH. Used by tools/counter-bench.sh.
local depth = tonumber(os.getenv("DEPTH") or "16")
local object = os.getenv("OBJECT") or "x"
local req

init = function(args)
  local one = wrk.format("POST", "/o/counter/" .. object, { ["Content-Length"] = "0" }, "")
  req = string.rep(one, depth)
end

request = function()
  return req
end

done = function(summary, latency, requests)
  io.write(string.format("answers %d non2xx %d errors_read %d errors_timeout %d\n",
    summary.requests, summary.errors.status, summary.errors.read, summary.errors.timeout))
end
