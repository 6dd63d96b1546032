#!/bin/sh
# ri bench load --worker --quick: a real ri-kvstore and a real ri-worker
# (SmolLM2) under 15 s of streaming, aborting and SIGKILLed HTTP clients,
# slowloris connections and a /health prober.  Checks that the JSON report
# has the bench's shape and every field of the worker row with a sane type
# and range; not that the numbers are good (how many /health probes fail
# under slowloris, how many sessions leak, is what the bench measures).
# The bench may exit 1 (a process did not serve at the end): that is a
# finding it reports, not a broken report.  --api-key is exercised (the key
# is sent as a bearer token; a worker without keys ignores it).  Skipped
# (77) without the model.  About 25 s.
set -u
bin="$RI_BUILD_DIR/bin"
model="${RI_TEST_MODEL:-${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
[ -x "$bin/ri-worker" ] && [ -x "$bin/ri-kvstore" ] || { echo "skip: ri-worker / ri-kvstore not built"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$bin/ri-bench-load" --worker --quick --clients 3 --slowloris 300 --api-key test-key \
  --worker-arg "--model=$model" --json "$tmp/load.json" > "$tmp/out.txt" 2>&1
rc=$?
grep -v '^health failure at' "$tmp/out.txt" | tail -n 20
[ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || { echo "FAIL: ri-bench-load exited $rc"; exit 1; }
python3 - "$tmp/load.json" "$model" <<'PY'
import json, re, sys

doc = json.load(open(sys.argv[1]))
bad = []


def check(cond, what):
    if not cond:
        bad.append(what)


check(doc.get("bench") == "load", "bench is 'load'")
check(re.fullmatch(r"[0-9a-f]{40}", str(doc.get("git"))) is not None, "git is a commit (%r)" % doc.get("git"))
m = doc.get("machine", {})
for k in ("cpu", "cores", "mem_bw_gbs", "load_avg"):
    check(k in m, "machine.%s" % k)
rows = doc.get("rows", [])
check(len(rows) == 1, "one row (%d)" % len(rows))
r = rows[0] if rows else {}
num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
ints = ["clients", "sessions", "requests", "completions_ok", "completions_failed", "streams_aborted",
        "clients_killed", "health_probes", "health_failed", "slowloris", "slowloris_held_end",
        "slowloris_opened", "slowloris_closed_by_server", "sessions_before", "sessions_after", "sessions_peak",
        "sessions_leaked"]
for k in ints:
    check(num(r.get(k)) and r[k] >= 0 and r[k] == int(r[k]), "%s is a count (%r)" % (k, r.get(k)))
for k in ("seconds", "health_p99_ms", "health_max_ms", "rss_before", "rss_after", "rss_worker_before",
          "rss_worker_after", "rss_kvstore_before", "rss_kvstore_after"):
    check(num(r.get(k)) and r[k] >= 0, "%s is a number >= 0 (%r)" % (k, r.get(k)))
for k in ("served_after", "worker_served_after", "kvstore_served_after", "api_key"):
    check(isinstance(r.get(k), bool), "%s is a boolean" % k)
check(r.get("mode") == "worker", "mode is 'worker'")
check(r.get("clients") == 3 and r.get("slowloris") == 300, "clients and slowloris as asked")
check(r.get("api_key") is True, "the api key was used")
check(r.get("worker_args") == ["--model=" + sys.argv[2]], "worker_args as passed (%r)" % r.get("worker_args"))
check(10 <= (r.get("seconds") or 0) <= 60, "seconds near 15 (%r)" % r.get("seconds"))
check(r.get("health_probes", 0) >= 30, "the prober ran every 200 ms (%r probes)" % r.get("health_probes"))
check(r.get("health_max_ms", -1) >= r.get("health_p99_ms", 0), "max >= p99")
check(r.get("rss_before") == r.get("rss_worker_before", 0) + r.get("rss_kvstore_before", 0)
      and r.get("rss_worker_before", 0) > 0 and r.get("rss_kvstore_before", 0) > 0,
      "rss_before is both processes' (each > 0)")
check(r.get("sessions_leaked") == max(0, r.get("sessions_after", 0) - r.get("sessions_before", 0)),
      "sessions_leaked = after - before")
e = r.get("errors")
check(isinstance(e, dict) and "health" in e and all(num(v) and v >= 0 for v in e.values()),
      "errors is an object of counts with a health entry")
check(isinstance(e, dict) and sum(v for k, v in e.items() if k != "health") == r.get("completions_failed"),
      "completion error kinds add up to completions_failed")
f = r.get("health_failures")
check(isinstance(f, list) and len(f) == r.get("health_failed"), "every health failure is listed")
check(all(isinstance(x, dict) and num(x.get("t_s")) and num(x.get("ms")) and isinstance(x.get("kind"), str)
          for x in (f or [])), "each failure has t_s, ms and kind")
for b in bad:
    print("FAIL:", b)
print("load --worker JSON: %s" % ("ok" if not bad else "%d problems" % len(bad)))
sys.exit(1 if bad else 0)
PY
