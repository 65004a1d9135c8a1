-- wrk: POST the benchmark body (read from BENCH_BODY_FILE) as JSON.
local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

-- With BENCH_SIGNATURE: signed as GitHub signs (the body never changes, so neither
-- does its signature), and each request with an X-GitHub-Delivery of its own, so a
-- deduplicating entrypoint stores every one. BENCH_RUN keeps runs' ids apart.
local signature = os.getenv("BENCH_SIGNATURE")
if signature then
   wrk.headers["X-Hub-Signature-256"] = signature
   local run = os.getenv("BENCH_RUN") or "0"
   local threads = 0
   function setup(thread)
      threads = threads + 1
      thread:set("thread_id", threads)
   end
   local sent = 0
   function request()
      sent = sent + 1
      wrk.headers["X-GitHub-Delivery"] = run .. "-" .. thread_id .. "-" .. sent
      return wrk.format()
   end
end
