#!/usr/bin/env bash
# A sequence whose kvstore session is lost is rebuilt from its token ids
# (label "slow": a ~1.3K-token prompt, long enough to be indexed and
# uploaded).  ri-worker --listen with retroinfer-remote gives back the K/V it
# uploaded, so it cannot re-fill a new session from it.  Every step reads
# two-sided here (RI_WORKER_DIRECT=false), so the decode notices at once when, in the
# middle of a streamed completion, the kvstore is killed (-9) and restarted
# empty on the same port: the backend cannot re-attach (nothing recovered),
# answers RI_ERR_LOST, and the scheduler prefills the prompt and the tokens
# generated so far into a new session and goes on.  The stream must finish
# with every token asked for (usage: exactly 48 completion tokens), its greedy
# text must equal the same request's without the kill (the rebuilt sequence
# holds the same context), ri_worker_sequences_rebuilt_total must count it,
# and the engine's K/V must really have been given back.
# "test_worker_rebuild.sh WORKER" runs another ri-worker binary: CTest runs
# it on ri-worker-mutant-rebuild (the rebuild re-prefills the generated
# tokens but not the prompt) and expects it to fail.
# Skips (77) without the installed model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kvs_up.sh"
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
worker="${1:-$RI_BUILD_DIR/bin/ri-worker}"
[ -x "$worker" ] || { echo "skip: $worker not built"; exit 77; }
KVS_MEMORY=1GiB kvs_up
addr="$KVS_GRPC"

RI_WORKER_DIRECT=false "$worker" --listen 127.0.0.1:0 --port-file "$KVS_DIR/wports" --kvstore "$addr" \
  --timeout-ms 2000 >"$KVS_DIR/worker.log" 2>&1 &
wpid=$!
cleanup() { kill "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true; kvs_down; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  [ -s "$KVS_DIR/wports" ] && break
  kill -0 "$wpid" 2>/dev/null || { cat "$KVS_DIR/worker.log"; exit 1; }
  sleep 0.1
done
http="$(sed -n 's/^http=//p' "$KVS_DIR/wports")"
[ -n "$http" ] || { echo "no http address"; cat "$KVS_DIR/worker.log"; exit 1; }

# The same request without a kill (the reference text), then the stream;
# after 8 tokens the stream runs the restart (a file it touches tells the
# shell), then reads on to the end.
python3 - "$http" "$KVS_DIR" <<'PY' &
import json, os, sys, time, urllib.request
http, d = sys.argv[1], sys.argv[2]
f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
prompt = ("There is an important info hidden inside a lot of irrelevant text." + f * 27 +
          " The pass key is 52817. Remember it." + f * 27 + " Repeat the pass key many times:")
mid = json.load(urllib.request.urlopen("http://%s/v1/models" % http, timeout=30))["data"][0]["id"]
ask = {"model": mid, "prompt": prompt, "max_tokens": 48, "temperature": 0, "attn": "retroinfer-remote"}
req = urllib.request.Request("http://%s/v1/completions" % http, json.dumps(ask).encode(),
                             {"Content-Type": "application/json"})
ref = json.load(urllib.request.urlopen(req, timeout=600))["choices"][0]["text"]
ask.update(stream=True, stream_options={"include_usage": True})
req = urllib.request.Request("http://%s/v1/completions" % http, json.dumps(ask).encode(),
                             {"Content-Type": "application/json"})
n, finish, text, usage = 0, None, "", None
with urllib.request.urlopen(req, timeout=600) as r:
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            print("stream error:", ev); sys.exit(1)
        usage = ev.get("usage") or usage
        if not ev.get("choices"):
            continue
        ch = ev["choices"][0]
        if ch.get("text"):
            n += 1
            text += ch["text"]
        finish = ch.get("finish_reason") or finish
        if n == 8 and not os.path.exists(d + "/kill"):
            open(d + "/kill", "w").close()
            for _ in range(600):              # wait until the kvstore is back
                if os.path.exists(d + "/back"):
                    break
                time.sleep(0.1)
json.dump({"pieces": n, "finish": finish, "text": text, "ref": ref,
           "tokens": (usage or {}).get("completion_tokens", -1)}, open(d + "/result.json", "w"))
PY
cpid=$!
for _ in $(seq 1 3000); do
  [ -e "$KVS_DIR/kill" ] && break
  kill -0 "$cpid" 2>/dev/null || break
  sleep 0.1
done
[ -e "$KVS_DIR/kill" ] || { echo "the stream never reached 8 tokens"; cat "$KVS_DIR/worker.log"; exit 1; }
kill -KILL "$KVS_PID"; wait "$KVS_PID" 2>/dev/null || true; KVS_PID=
kvs_up "$addr"
[ "$KVS_GRPC" = "$addr" ]
touch "$KVS_DIR/back"
wait "$cpid" || { echo "the client failed"; tail -30 "$KVS_DIR/worker.log"; exit 1; }

metrics="$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://$http/metrics', timeout=30).read().decode())")"
python3 - "$KVS_DIR/result.json" <<PY
import json, re, sys
r = json.load(open(sys.argv[1]))
m = """$metrics"""
def metric(name):
    g = re.search(r"^%s (\S+)$" % name, m, re.M)
    return float(g.group(1)) if g else -1
rebuilt, released = metric("ri_worker_sequences_rebuilt_total"), metric("ri_worker_kvstore_released_bytes_total")
print("stream: %d pieces, %d tokens, finish %s, rebuilt %g, engine K/V given back %g bytes" %
      (r["pieces"], r["tokens"], r["finish"], rebuilt, released))
print("with the kill:    %r" % r["text"])
print("without the kill: %r" % r["ref"])
ok = r["finish"] == "length" and r["tokens"] == 48 and rebuilt >= 1 and released > 0
if r["text"] != r["ref"]:
    print("FAIL: the rebuilt sequence's text differs from the one without the kill")
    ok = False
sys.exit(0 if ok else 1)
PY
grep -q "sequence rebuilt from its" "$KVS_DIR/worker.log" || { echo "no rebuild in the worker's log"; exit 1; }
echo "ri-worker: a sequence whose kvstore session was lost was rebuilt from its tokens and finished"
