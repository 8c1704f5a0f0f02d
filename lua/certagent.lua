-- certagent: ask the agent to load the certificate for this connection's SNI.
--
-- Used from the public `mode tcp` frontend, only for hosts not yet marked
-- loaded in its stick table:
--   tcp-request content lua.certagent_ensure <agent socket> <timeout ms> if ...
-- Sends "ensure <host> <worker pid>": the pid tells the agent which HAProxy
-- process asks, so it notices a reload on the first request from the new one.
-- Sets txn.certagent to the outcome: ok | unknown | busy | invalid | error |
-- nosni | down | timeout.  Anything but "ok" means the client gets the
-- configured fallback (default certificate, or reject).  All logic lives in
-- the agent; this file only validates, asks and records.

local ANSWERS = { ok = true, unknown = true, busy = true, invalid = true, error = true }

-- Every call leaves a few KB of garbage (its core.tcp() socket). On Lua 5.3 (HAProxy 2.6)
-- the default pause (200 %) lets the heap of a busy HAProxy double between cycles and its
-- low point creep up; starting a new cycle as soon as one ends keeps it near the live set
-- (measured: 1.8-4 MB less worker memory) at no measurable cost per call. On Lua 5.4
-- (HAProxy 3.x) the same setting keeps the incremental collector running without a break:
-- in a storm of new hosts it took a third of HAProxy's CPU there, so 5.4 keeps its defaults.
if _VERSION == "Lua 5.3" then
  collectgarbage("setpause", 100)
end

-- LDH labels, at least two, 253 characters at most (already lowercased), the last one
-- starting with a letter like every top-level domain (127.0.0.1 is an address).
local function valid_hostname(name)
  if #name == 0 or #name > 253 then return false end
  local labels, last = 0, ""
  for label in (name .. "."):gmatch("([^.]*)%.") do
    if #label == 0 or #label > 63 then return false end
    if not label:find("^[a-z0-9][a-z0-9-]*$") then return false end
    if label:sub(-1) == "-" then return false end
    labels, last = labels + 1, label
  end
  return labels >= 2 and last:find("^%a") ~= nil
end

-- This worker's pid, read on first use: lua-load runs in the master, before the fork.
-- With lua-load-per-thread (HAProxy 3.x) each thread's Lua state has its own copy,
-- each read once.
local PID = nil

core.register_action("certagent_ensure", { "tcp-req" }, function(txn, socket_path, timeout_ms)
  local sni = txn.f:req_ssl_sni()
  if sni == nil or sni == "" then
    txn:set_var("txn.certagent", "nosni")
    return
  end
  sni = sni:lower()
  if not valid_hostname(sni) then
    txn:set_var("txn.certagent", "invalid")
    return
  end
  local sock = core.tcp()
  sock:settimeout((tonumber(timeout_ms) or 3000) / 1000)
  if not sock:connect("unix@" .. socket_path) then
    sock:close()
    txn:set_var("txn.certagent", "down")
    return
  end
  if PID == nil then
    PID = core.get_info()["Pid"] or "0"
  end
  local answer = nil
  if sock:send("ensure " .. sni .. " " .. PID .. "\n") then
    answer = sock:receive("*l")
  end
  sock:close()
  if answer ~= nil and ANSWERS[answer] then
    txn:set_var("txn.certagent", answer)
  else
    txn:set_var("txn.certagent", "timeout")
  end
end, 2)
