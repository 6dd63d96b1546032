#!/usr/bin/env python3
"""ri-worker's HTTP service (--listen), against the real process and model.

One ctest test per mode (the first argument):
  api       every endpoint's shapes (completions and chat, streaming and not),
            greedy output equal to the stdin mode's, stop strings, seeds, the
            attn extension, every 4xx case, /metrics counting exactly what was
            sent, SIGTERM -> exit 0, and a failed start -> exit 1
  batch     4 concurrent requests share the decode batch (batch > 1 in
            /metrics), each answer equal to the same request alone
  queue     --max-batch 1 --queue-size 1: surplus requests get 429 with
            Retry-After and OpenAI's error body; the accepted ones finish
  shutdown  SIGTERM drains: a running request finishes, /health says 503
            meanwhile; with a short drain timeout a stream is cancelled with an
            error event; both exit 0
  remote    with --kvstore (a real ri-kvstore): "attn": "retroinfer-remote"
            answers through the kvstore and its counters reach /metrics

Only the standard library (http.client, urllib): the tests must not depend
on the openai package.  Exits 77 (skipped) without the model or the binaries.
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

BUILD = os.environ.get("RI_BUILD_DIR", "build")
WORKER = os.path.join(BUILD, "bin", "ri-worker")
KVSTORE = os.path.join(BUILD, "bin", "ri-kvstore")
MODEL = os.path.join(os.environ.get("RI_MODEL_DIR", os.path.expanduser("~/.cache/retroinfer/models")),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
PROMPT = "The capital of France is"
QUESTION = "What is 2+2?"

failures = []


def check(cond, what):
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


class Worker:
    """ri-worker --listen 127.0.0.1:0 with its port file, stopped by SIGTERM."""

    def __init__(self, *flags, tmp):
        self.port_file = os.path.join(tmp, "worker-%d.port" % time.monotonic_ns())
        self.log = open(os.path.join(tmp, "worker.log"), "ab")
        self.proc = subprocess.Popen([WORKER, "--listen", "127.0.0.1:0", "--port-file", self.port_file,
                                      "--threads", "2", *flags], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log)
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(self.port_file):
                keys = dict(l.split("=", 1) for l in open(self.port_file).read().split())
                self.addr = keys["http"]
                self.host, self.port = self.addr.rsplit(":", 1)
                return
            if self.proc.poll() is not None:
                self.log.flush()
                tail = open(os.path.join(tmp, "worker.log"), "rb").read()[-2000:].decode(errors="replace")
                raise SystemExit("ri-worker exited %d at start; its log ends:\n%s" % (self.proc.returncode, tail))
            time.sleep(0.05)
        raise SystemExit("ri-worker wrote no port file in 60 s")

    def conn(self, timeout=120):
        return http.client.HTTPConnection(self.host, int(self.port), timeout=timeout)

    def request(self, method, path, body=None, raw=None):
        """(status, headers, parsed JSON or text) of one request."""
        c = self.conn()
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        payload = r.read()
        c.close()
        ctype = r.getheader("Content-Type", "")
        return r.status, r, json.loads(payload) if "json" in ctype else payload.decode()

    def stream(self, path, body):
        """(status, content type, [event JSON..., "[DONE]"]) of a streaming request."""
        c = self.conn()
        c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events = []
        if r.status == 200:
            for line in r:
                line = line.decode().rstrip("\r\n")
                if line.startswith("data: "):
                    d = line[6:]
                    events.append(d if d == "[DONE]" else json.loads(d))
                    if d == "[DONE]":
                        break
        else:
            events.append(json.loads(r.read()))
        c.close()
        return r.status, r.getheader("Content-Type", ""), events

    def metrics(self):
        st, _, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "hung"


def stdin_answer(prompt, max_tokens, chat=False):
    """The stdin JSON-lines mode's answer to the same request (greedy)."""
    line = json.dumps({"id": 1, "prompt": prompt, "max_tokens": max_tokens, "attn": "full", "chat": chat})
    out = subprocess.run([WORKER, "--threads", "2"], input=line + "\n", capture_output=True, text=True, timeout=300)
    r = json.loads(out.stdout.splitlines()[0])
    assert r["ok"], r
    return r["runs"][0]["text"], r["prompt_tokens"]


def completion(prompt=PROMPT, **kw):
    return dict({"model": MODEL_ID, "prompt": prompt, "max_tokens": 16, "temperature": 0}, **kw)


def chat(question=QUESTION, **kw):
    return dict({"model": MODEL_ID, "messages": [{"role": "user", "content": question}], "max_tokens": 16,
                 "temperature": 0}, **kw)


def text_of(resp, is_chat):
    return resp["choices"][0]["message"]["content"] if is_chat else resp["choices"][0]["text"]


def stream_text(events, is_chat):
    parts = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            c = e["choices"][0]
            parts.append(c.get("delta", {}).get("content") or "" if is_chat else c.get("text", ""))
    return "".join(parts)


def check_error(st, resp, status, param="?", what=""):
    e = resp.get("error") if isinstance(resp, dict) else None
    ok = st == status and isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"] and \
        isinstance(e.get("type"), str) and "param" in e and "code" in e
    if ok and param != "?":
        ok = e["param"] == param
    return check(ok, "%s -> %d with an OpenAI error body%s (got %d %s)" % (
        what, status, "" if param == "?" else " naming param %r" % param, st, json.dumps(resp)[:200]))


def test_api(tmp):
    sent = {}  # (endpoint, status) -> count, to compare with /metrics

    def count(ep, st):
        sent[(ep, st)] = sent.get((ep, st), 0) + 1

    w = Worker("--max-tokens", "16", tmp=tmp)
    try:
        st, r, h = w.request("GET", "/health")
        count("/health", st)
        check(st == 200 and h["status"] == "ok", "GET /health -> 200 ok")
        st, r, m = w.request("GET", "/v1/models")
        count("/v1/models", st)
        check(st == 200 and m["object"] == "list" and [d["id"] for d in m["data"]] == [MODEL_ID] and
              m["data"][0]["object"] == "model", "GET /v1/models lists the model")
        st, r, m = w.request("GET", "/v1/models/" + MODEL_ID)
        count("/v1/models", st)
        check(st == 200 and m["id"] == MODEL_ID, "GET /v1/models/{id}")

        # greedy through HTTP == the stdin mode, completion and chat
        want_c, ptok_c = stdin_answer(PROMPT, 24)
        want_q, ptok_q = stdin_answer(QUESTION, 24, chat=True)
        st, r, c = w.request("POST", "/v1/completions", completion(max_tokens=24))
        count("/v1/completions", st)
        check(st == 200 and c["object"] == "text_completion" and c["id"].startswith("cmpl-") and
              c["model"] == MODEL_ID and isinstance(c["created"], int) and c["choices"][0]["index"] == 0 and
              c["choices"][0]["finish_reason"] in ("stop", "length") and
              r.getheader("Content-Type") == "application/json", "completion: OpenAI's shape")
        u = c.get("usage", {})
        check(u.get("prompt_tokens") == ptok_c and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
              and 1 <= u["completion_tokens"] <= 24, "completion: usage (prompt tokens as the stdin mode counts)")
        check(text_of(c, False) == want_c, "completion: greedy text equals the stdin mode's (%r vs %r)" % (
            text_of(c, False), want_c))
        st, r, q = w.request("POST", "/v1/chat/completions", chat(max_tokens=24))
        count("/v1/chat/completions", st)
        check(st == 200 and q["object"] == "chat.completion" and q["id"].startswith("chatcmpl-") and
              q["choices"][0]["message"]["role"] == "assistant" and q["usage"]["prompt_tokens"] == ptok_q,
              "chat completion: OpenAI's shape")
        check(text_of(q, True) == want_q, "chat: greedy text equals the stdin mode's --chat (%r vs %r)" % (
            text_of(q, True), want_q))

        # streaming: same text, chunk shapes, [DONE] last
        st, ctype, ev = w.stream("/v1/completions", completion(max_tokens=24))
        count("/v1/completions", st)
        chunks = [e for e in ev if isinstance(e, dict)]
        check(st == 200 and ctype.startswith("text/event-stream") and ev[-1] == "[DONE]" and len(chunks) >= 2,
              "completion stream: event stream ending with [DONE]")
        check(all(e["object"] == "text_completion" and e["id"] == chunks[0]["id"] for e in chunks) and
              chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and
              all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1]),
              "completion stream: one id, finish_reason only on the last chunk")
        check(stream_text(ev, False) == want_c, "completion stream: text equals the stdin mode's")
        st, ctype, ev = w.stream("/v1/chat/completions", chat(max_tokens=24, stream_options={"include_usage": True}))
        count("/v1/chat/completions", st)
        chunks = [e for e in ev if isinstance(e, dict)]
        check(st == 200 and ev[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"].get("role") == "assistant" and
              all(e["object"] == "chat.completion.chunk" for e in chunks), "chat stream: role first, chunk objects")
        check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == ptok_q and
              chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length"),
              "chat stream: finish_reason, then the usage chunk (include_usage)")
        check(stream_text(ev, True) == want_q, "chat stream: text equals the stdin mode's")

        # stop strings: cut before the stop, finish_reason stop, streaming too
        k = len(want_c) // 2
        stop = want_c[k:k + 3]
        cut = want_c[:want_c.find(stop)]
        st, r, c = w.request("POST", "/v1/completions", completion(max_tokens=24, stop=stop))
        count("/v1/completions", st)
        check(st == 200 and text_of(c, False) == cut and c["choices"][0]["finish_reason"] == "stop",
              "stop %r: text %r, finish_reason stop" % (stop, cut))
        st, _, ev = w.stream("/v1/completions", completion(max_tokens=24, stop=["zzzz", stop]))
        count("/v1/completions", st)
        check(stream_text(ev, False) == cut and [e for e in ev if isinstance(e, dict)][-1]["choices"][0][
            "finish_reason"] == "stop", "stop list, streaming: same cut, nothing of the stop string sent")

        # sampling: a seed repeats, max_tokens bounds
        a = w.request("POST", "/v1/completions", completion(temperature=1.0, top_p=0.9, seed=7))
        b = w.request("POST", "/v1/completions", completion(temperature=1.0, top_p=0.9, seed=7))
        count("/v1/completions", a[0])
        count("/v1/completions", b[0])
        check(a[0] == 200 and text_of(a[2], False) == text_of(b[2], False), "temperature 1 with seed 7 repeats")
        st, _, c = w.request("POST", "/v1/completions", completion(prompt="Once upon a time", max_tokens=3))
        count("/v1/completions", st)
        check(st == 200 and c["usage"]["completion_tokens"] == 3 and c["choices"][0]["finish_reason"] == "length",
              "max_tokens 3 -> 3 tokens, finish_reason length")
        # ignore_eos: the stop token no longer ends the text, max_tokens does
        st, _, c = w.request("POST", "/v1/chat/completions", chat(question="Is the sky blue? Answer yes or no.", max_tokens=40))
        count("/v1/chat/completions", st)
        n_stop = c["usage"]["completion_tokens"] if st == 200 else -1
        check(st == 200 and c["choices"][0]["finish_reason"] == "stop" and n_stop < 40,
              "a short answer ends at the stop token (%d tokens)" % n_stop)
        st, _, c = w.request("POST", "/v1/chat/completions", chat(question="Is the sky blue? Answer yes or no.", max_tokens=40, ignore_eos=True))
        count("/v1/chat/completions", st)
        check(st == 200 and c["usage"]["completion_tokens"] == 40 and c["choices"][0]["finish_reason"] == "length",
              "ignore_eos: exactly max_tokens, finish_reason length")
        st, _, c = w.request("POST", "/v1/completions", completion(max_tokens=None))
        count("/v1/completions", st)
        check(st == 200 and c["usage"]["completion_tokens"] <= 16, "no max_tokens -> the server's --max-tokens")
        st, _, c = w.request("POST", "/v1/completions", completion(attn="retroinfer"))
        count("/v1/completions", st)
        check(st == 200 and text_of(c, False) == want_c[:len(text_of(c, False))],
              "attn retroinfer (short prompt: dense) answers like full")
        st, _, c = w.request("POST", "/v1/chat/completions", {
            "model": MODEL_ID, "temperature": 0, "max_tokens": 8, "messages": [
                {"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": [
                    {"type": "text", "text": "Capital of "}, {"type": "text", "text": "France?"}]}]})
        count("/v1/chat/completions", st)
        check(st == 200 and c["usage"]["prompt_tokens"] > 20, "chat: system + several turns + content parts")

        # every bad request: a 4xx with OpenAI's error body
        C, Q = "/v1/completions", "/v1/chat/completions"
        bad = [
            (C, None, b"{not json", 400, None, "bad JSON"),
            (C, None, b"[1, 2]", 400, None, "a JSON array"),
            (C, {"prompt": PROMPT}, None, 400, "model", "no model"),
            (C, completion(model="gpt-4"), None, 404, "model", "unknown model"),
            (C, {"model": MODEL_ID}, None, 400, "prompt", "no prompt"),
            (C, completion(prompt=""), None, 400, "prompt", "empty prompt"),
            (C, completion(ignore_eos="yes"), None, 400, "ignore_eos", "ignore_eos not a boolean"),
            (C, completion(prompt=["a", "b"]), None, 400, "prompt", "two prompts"),
            (C, completion(prompt=[1, 99999999]), None, 400, "prompt", "token id out of the vocabulary"),
            (Q, {"model": MODEL_ID}, None, 400, "messages", "no messages"),
            (Q, chat(messages=[]), None, 400, "messages", "empty messages"),
            (Q, chat(messages=[{"role": "wizard", "content": "x"}]), None, 400, "messages", "unknown role"),
            (Q, chat(messages=[{"role": "user", "content": 5}]), None, 400, "messages", "content not text"),
            (C, completion(prompt="hello " * 9000), None, 400, "prompt", "prompt longer than the context"),
            (C, completion(max_tokens=8190), None, 400, "prompt", "prompt + max_tokens over the context"),
            (C, completion(temperature=-0.5), None, 400, "temperature", "temperature < 0"),
            (C, completion(temperature="hot"), None, 400, "temperature", "temperature not a number"),
            (C, completion(top_p=0), None, 400, "top_p", "top_p 0"),
            (C, completion(top_p=1.5), None, 400, "top_p", "top_p > 1"),
            (C, completion(max_tokens=0), None, 400, "max_tokens", "max_tokens 0"),
            (C, completion(max_tokens=2.5), None, 400, "max_tokens", "max_tokens not an integer"),
            (Q, chat(max_tokens=None, max_completion_tokens=-1), None, 400, "max_completion_tokens",
             "max_completion_tokens < 1"),
            (C, completion(n=2), None, 400, "n", "n > 1"),
            (C, completion(stop=["a", "b", "c", "d", "e"]), None, 400, "stop", "five stop strings"),
            (C, completion(stop=5), None, 400, "stop", "stop not a string"),
            (C, completion(stream="yes"), None, 400, "stream", "stream not a boolean"),
            (C, completion(seed="x"), None, 400, "seed", "seed not an integer"),
            (C, completion(logprobs=2), None, 400, "logprobs", "logprobs (unsupported)"),
            (C, completion(echo=True), None, 400, "echo", "echo (unsupported)"),
            (C, completion(presence_penalty=0.5), None, 400, "presence_penalty", "a penalty (unsupported)"),
            (C, completion(attn="bogus"), None, 400, "attn", "unknown attn"),
            (C, completion(attn="retroinfer-remote"), None, 400, "attn", "retroinfer-remote without --kvstore"),
            (C, completion(attn=["full"]), None, 400, "attn", "attn not a string"),
            (C, None, b"{\"model\": \"" + MODEL_ID.encode() + b"\", \"prompt\": \"" + b"x" * (9 << 20) + b"\"}",
             413, None, "a body over 8 MiB"),
        ]
        for path, body, raw, status, param, what in bad:
            st, _, resp = w.request("POST", path, body, raw)
            count(path, st)
            check_error(st, resp, status, param, what)
        st, _, resp = w.request("GET", C)
        count(C, st)
        check_error(st, resp, 405, what="GET /v1/completions")
        st, _, resp = w.request("POST", "/v1/models", {})
        count("/v1/models", st)
        check_error(st, resp, 405, what="POST /v1/models")
        st, _, resp = w.request("GET", "/v1/models/nope")
        count("/v1/models", st)
        check_error(st, resp, 404, "model", "GET /v1/models/nope")
        st, _, resp = w.request("GET", "/v2/nothing")
        count("other", st)
        check_error(st, resp, 404, what="GET /v2/nothing")
        st, _, ev = w.stream(C, completion(temperature=-1))
        count(C, st)
        check_error(st, ev[0], 400, "temperature", "a bad streaming request (before any event)")

        # /metrics counts exactly what was sent, and the tokens
        m = w.metrics()
        for (ep, code), n in sorted(sent.items()):
            got = m.get('ri_worker_requests_total{endpoint="%s",code="%d"}' % (ep, code), 0)
            check(got == n, "metrics: requests_total %s %d = %d (got %g)" % (ep, code, n, got))
        gens = sum(n for (ep, code), n in sent.items() if code == 200 and ep.startswith("/v1/") and "models" not in ep)
        check(m["ri_worker_time_to_first_token_seconds_count"] == gens and
              m['ri_worker_time_to_first_token_seconds_bucket{le="+Inf"}'] == gens,
              "metrics: one time-to-first-token per answered generation (%d)" % gens)
        check(m["ri_worker_inter_token_latency_seconds_count"] > gens and
              m["ri_worker_generated_tokens_total"] >= m["ri_worker_inter_token_latency_seconds_count"] and
              m["ri_worker_prompt_tokens_total"] >= 2 * ptok_q, "metrics: tokens and inter-token latencies")
        check(m['ri_worker_requests_finished_total{reason="stop"}'] >= 2 and
              m['ri_worker_requests_finished_total{reason="length"}'] >= 1 and
              m["ri_worker_queue_depth"] == 0 and m["ri_worker_running_requests"] == 0 and
              m["ri_worker_batch_size_max"] == 1, "metrics: finish reasons, queue, batch gauges")
        # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, K and V, fp16 (what the
        # prefix bench prices a sequence's steady zone with)
        check(m.get("ri_worker_kv_bytes_per_token") == 30 * 3 * 64 * 2 * 2,
              "metrics: K/V bytes a token = 23040 (got %s)" % m.get("ri_worker_kv_bytes_per_token"))
        # this machine has no device memory space: misses would stay in host memory
        check(m.get('ri_worker_device_transport{transport="host"}') == 1 and
              sum(1 for k in m if k.startswith("ri_worker_device_transport{")) == 1,
              "metrics: the device transport is host, alone")
    finally:
        rc = w.stop()
    check(rc == 0 and not os.path.exists(w.port_file), "SIGTERM -> exit 0, port file removed (rc %s)" % rc)

    # failing to start is an exit status, not a silent 0
    busy = Worker(tmp=tmp)
    try:
        p = subprocess.run([WORKER, "--listen", busy.addr], capture_output=True, text=True, timeout=120)
        check(p.returncode == 1 and "cannot serve HTTP" in p.stderr, "listen on a port in use -> exit 1 (%d: %s)" % (
            p.returncode, p.stderr.strip()[-120:]))
    finally:
        busy.stop()
    p = subprocess.run([WORKER, "--listen", "localhost:x"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 1, "listen on a bad address -> exit 1 (%d)" % p.returncode)
    p = subprocess.run([WORKER, "--listen", "127.0.0.1:0", "--kvstore", "127.0.0.1:1"], capture_output=True,
                       text=True, timeout=120)
    check(p.returncode == 1, "--kvstore unreachable -> exit 1 (%d)" % p.returncode)
    p = subprocess.run([WORKER, "--listen", "127.0.0.1:0", "--model", os.path.join(tmp, "none.gguf")],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 1, "a model that cannot be loaded -> exit 1 (%d)" % p.returncode)
    p = subprocess.run([WORKER, "--listen", "127.0.0.1:0", "--prefill-chunk", "100"], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 2, "--prefill-chunk 100 -> exit 2 (%d)" % p.returncode)


def test_batch(tmp):
    prompts = [PROMPT, "Once upon a time", "The best way to learn programming is", "Water boils at"]
    w = Worker("--max-batch", "8", tmp=tmp)
    try:
        alone = {}
        for p in prompts:
            st, _, c = w.request("POST", "/v1/completions", completion(p, max_tokens=32))
            alone[p] = text_of(c, False)
        m0 = w.metrics()
        check(m0["ri_worker_batch_size_max"] == 1, "one request at a time: batch size 1")
        res, start = {}, threading.Barrier(len(prompts))

        def one(i, p):
            start.wait()
            if i % 2:  # half of them stream
                st, _, ev = w.stream("/v1/completions", completion(p, max_tokens=32))
                res[p] = (st, stream_text(ev, False))
            else:
                st, _, c = w.request("POST", "/v1/completions", completion(p, max_tokens=32))
                res[p] = (st, text_of(c, False) if st == 200 else c)

        t0 = time.time()
        th = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        dt = time.time() - t0
        check(all(res[p][0] == 200 for p in prompts), "4 concurrent requests all answered 200")
        for p in prompts:
            check(res[p][1] == alone[p], "batched answer equals the answer alone for %r" % p)
        m = w.metrics()
        steps = m["ri_worker_decode_batch_size_count"] - m0["ri_worker_decode_batch_size_count"]
        single = m['ri_worker_decode_batch_size_bucket{le="1"}'] - m0['ri_worker_decode_batch_size_bucket{le="1"}']
        check(m["ri_worker_batch_size_max"] >= 2 and steps > single,
              "metrics: decode steps with batch > 1 (max %g; %d of %d steps)" % (
                  m["ri_worker_batch_size_max"], steps - single, steps))
        check(m["ri_worker_time_to_first_token_seconds_count"] == 2 * len(prompts),
              "metrics: a TTFT per request (%g)" % m["ri_worker_time_to_first_token_seconds_count"])
        print("4 concurrent x 32 tokens: %.2f s" % dt)
    finally:
        rc = w.stop()
    check(rc == 0, "SIGTERM -> exit 0")


def test_queue(tmp):
    w = Worker("--max-batch", "1", "--queue-size", "1", tmp=tmp)
    try:
        res = []
        lock, start = threading.Lock(), threading.Barrier(5)

        def one():
            start.wait()
            st, r, c = w.request("POST", "/v1/completions", completion(max_tokens=128, prompt="Once upon a time"))
            with lock:
                res.append((st, r.getheader("Retry-After"), c))

        th = [threading.Thread(target=one) for _ in range(5)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        busy = [x for x in res if x[0] == 429]
        ok = [x for x in res if x[0] == 200]
        check(len(busy) >= 3 and len(ok) >= 1 and len(busy) + len(ok) == 5,
              "5 at once with 1 slot + 1 queued: %d answered, %d got 429" % (len(ok), len(busy)))
        check(all(b[1] is not None and int(b[1]) >= 1 for b in busy), "429 carries Retry-After")
        for b in busy[:1]:
            check_error(429, b[2], 429, what="queue full")
            check(b[2]["error"]["code"] == "rate_limit_exceeded", "429 code rate_limit_exceeded")
        m = w.metrics()
        check(m["ri_worker_queue_rejected_total"] == len(busy) and
              m['ri_worker_requests_total{endpoint="/v1/completions",code="429"}'] == len(busy),
              "metrics count the 429s (%g)" % m["ri_worker_queue_rejected_total"])
        st, _, c = w.request("POST", "/v1/completions", completion(max_tokens=4))
        check(st == 200, "after the burst the worker serves again")
    finally:
        rc = w.stop()
    check(rc == 0, "SIGTERM -> exit 0")


def test_shutdown(tmp):
    w = Worker("--drain-timeout-ms", "60000", tmp=tmp)
    # a client that goes away mid-stream: its request leaves the batch
    c = w.conn()
    c.request("POST", "/v1/completions", body=json.dumps(completion(prompt="Once upon a time", max_tokens=4000,
                                                                    temperature=0.8, stream=True)).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    got = 0
    for line in r:
        got += line.startswith(b"data: ")
        if got >= 3:
            break
    c.sock.shutdown(2)
    c.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = w.metrics()
        if m['ri_worker_requests_finished_total{reason="cancelled"}'] >= 1:
            break
        time.sleep(0.05)
    check(m['ri_worker_requests_finished_total{reason="cancelled"}'] == 1 and m["ri_worker_running_requests"] == 0
          and m["ri_worker_generated_tokens_total"] < 4000,
          "a stream closed by its client is cancelled (%g tokens generated)" % m["ri_worker_generated_tokens_total"])

    # a running request finishes within the drain timeout; /health says draining
    out = {}
    gen0 = m["ri_worker_generated_tokens_total"]

    def long_one():
        out["r"] = w.request("POST", "/v1/completions", completion(prompt="Once upon a time", max_tokens=96,
                                                                   temperature=0.7, seed=1, stop=None))

    t = threading.Thread(target=long_one)
    t.start()
    while w.metrics().get("ri_worker_generated_tokens_total", 0) < gen0 + 2:
        time.sleep(0.02)
    w.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        st, _, h = w.request("GET", "/health")
        check(st == 503 and h["status"] == "draining", "while draining /health -> 503 draining")
        st, r, c = w.request("POST", "/v1/completions", completion(max_tokens=4))
        check_error(st, c, 503, what="a new request while draining")
        check(r.getheader("Retry-After") is not None and c["error"]["code"] == "shutting_down",
              "503 while draining: Retry-After, code shutting_down")
    except OSError as e:
        check(False, "while draining /health answers (%s)" % e)
    t.join(120)
    rc = w.proc.wait(60)
    st, _, c = out["r"]
    check(st == 200 and c["usage"]["completion_tokens"] >= 1, "the running request finished (%d)" % st)
    check(rc == 0, "drained, exit 0 (%s)" % rc)

    # a short drain timeout cancels a long stream with an error event
    w = Worker("--drain-timeout-ms", "200", tmp=tmp)
    out = {}

    def long_stream():
        out["r"] = w.stream("/v1/completions", completion(prompt="Once upon a time", max_tokens=4000,
                                                          temperature=0.8, seed=3))

    t = threading.Thread(target=long_stream)
    t.start()
    while w.metrics().get("ri_worker_generated_tokens_total", 0) < 2:
        time.sleep(0.02)
    t0 = time.time()
    w.proc.send_signal(signal.SIGTERM)
    rc = w.proc.wait(60)
    t.join(60)
    st, _, ev = out["r"]
    errs = [e for e in ev if isinstance(e, dict) and "error" in e]
    check(st == 200 and errs and errs[0]["error"]["code"] == "shutting_down" and ev[-1] == "[DONE]",
          "the stream ends with a shutting_down error event and [DONE]")
    check(rc == 0 and time.time() - t0 < 20, "exit 0 within the bound (%s, %.1f s)" % (rc, time.time() - t0))


def test_remote(tmp):
    env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "posix,sysv,cma,tcp,self"))
    ports = os.path.join(tmp, "kvs.ports")
    kvs = subprocess.Popen([KVSTORE, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0",
                            "--metrics-listen=127.0.0.1:0", "--insecure-admin", "--memory=512MiB", "--no-hugepages",
                            "--drain-timeout-ms=3000", "--port-file=" + ports],
                           stdout=open(os.path.join(tmp, "kvstore.log"), "wb"), stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(1500):
            if os.path.exists(ports):
                break
            if kvs.poll() is not None:
                raise SystemExit("ri-kvstore exited %d" % kvs.returncode)
            time.sleep(0.01)
        grpc = dict(l.split("=", 1) for l in open(ports).read().split("\n") if "=" in l)["grpc"]
        os.environ["UCX_TLS"] = env["UCX_TLS"]
        w = Worker("--kvstore", grpc, "--attn", "full", tmp=tmp)
        try:
            f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
            prompt = "There is an important info hidden inside a lot of irrelevant text." + f * 60 + \
                " The pass key is 52817. Remember it." + f * 5 + " What is the pass key? The pass key is"
            st, _, c = w.request("POST", "/v1/completions", completion(prompt, max_tokens=6, attn="retroinfer-remote"))
            check(st == 200 and c["usage"]["prompt_tokens"] > 1092 and c["usage"]["completion_tokens"] >= 1,
                  "attn retroinfer-remote answers (%d, %s)" % (st, json.dumps(c)[:200]))
            m = w.metrics()
            check(m.get("ri_worker_kvstore_cache_hits_total", 0) + m.get("ri_worker_kvstore_cache_misses_total", 0)
                  + m.get("ri_worker_kvstore_direct_clusters_total", 0) > 0
                  and m.get("ri_worker_kvstore_uploaded_bytes_total", 0) > 0,
                  "metrics: clusters read from the kvstore (in place or fetched) and uploads")
            st, _, c = w.request("POST", "/v1/completions", completion(max_tokens=4))
            check(st == 200, "the server default (full) still answers")
        finally:
            rc = w.stop()
        check(rc == 0, "SIGTERM -> exit 0")
    finally:
        kvs.terminate()
        kvs.wait(30)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "api"
    if not os.path.exists(MODEL):
        print("skip: no model at %s" % MODEL)
        return 77
    if not os.access(WORKER, os.X_OK) or (mode == "remote" and not os.access(KVSTORE, os.X_OK)):
        print("skip: ri-worker / ri-kvstore not built in %s" % BUILD)
        return 77
    with tempfile.TemporaryDirectory(prefix="ri-http-") as tmp:
        try:
            {"api": test_api, "batch": test_batch, "queue": test_queue, "shutdown": test_shutdown,
             "remote": test_remote}[mode](tmp)
        except Exception as e:  # a dead worker shows as a reset connection: show its log too
            check(False, "%s: %s" % (type(e).__name__, e))
        finally:
            log = os.path.join(tmp, "worker.log")
            if failures and os.path.exists(log):
                print("--- ri-worker log (tail) ---")
                print(open(log, errors="replace").read()[-3000:])
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
