-- wrk: POST the body in the file $NDM_SERVE_BODY as JSON, on keep-alive
-- connections.
local f = assert(io.open(os.getenv("NDM_SERVE_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
