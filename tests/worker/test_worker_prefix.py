#!/usr/bin/env python3
"""Prefix reuse through ri-worker's HTTP service, against real processes.

One ctest test per mode (the first argument):
  full        --attn full: the same ~1.5K-token document + question twice;
              the second answer reports cached_tokens > 0 (completions and
              chat, streaming and not) and is token-for-token the greedy
              text of a worker with --prefix-cache false; /metrics counts
              the lookups, hits and published blocks
  retroinfer  the same with the in-process wave index (imported pieces)
  two         two ri-worker processes on one kvstore: the second reuses the
              blocks the first published, then both decode different
              questions at once, each equal to the reference answer
  remote      "full"'s checks with --attn retroinfer-remote (the session
              attaches the blocks and imports their pieces itself)
  two-remote  "two" with --attn retroinfer-remote
  prime / prime-remote
              a warm-up request with max_tokens 1 (it ends before any
              decode step) publishes the document's blocks: the same
              prompt again reports cached_tokens > 0 and answers the
              reference's greedy text (retroinfer / retroinfer-remote)
  gemma-remote
              Gemma 3 270M (sliding-window layers) on retroinfer-remote:
              the same document twice, the second time cached and the
              greedy text of a worker with --no-prefix-cache
  kill-remote retroinfer-remote with a spill-tier kvstore: a streamed
              request that attached the document's blocks sees the kvstore
              killed (-9) and restarted with --recover mid-answer; the
              stream still ends with the reference's text, and a new
              request with the same document answers it too
  lines       the JSON-lines mode (stdin) goes through the same scheduler:
              the same document twice on one pipe, with compare_attn
              retroinfer; the second reply reports cached_tokens > 0 and
              both runs answer the first reply's greedy texts (the fork
              of a preloaded prefill included); --no-prefix-cache
              reports 0 cached

Exits 77 (skipped) without the model or the binaries.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_worker_http as wh  # noqa: E402  (the Worker helper and the checks)

check = wh.check
DOC = ("Notes of the harbour office, volume three. " +
       " ".join("Ship %d arrived from port %d carrying %d crates of %s." %
                (i, i * 7 % 13, 10 + i * 3 % 17, ["tea", "salt", "wool", "iron", "glass"][i % 5])
                for i in range(1, 80)))
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
QUESTIONS = [" Question: what did ship 12 carry? Answer:", " Question: where did ship 30 come from? Answer:"]


def start_kvstore(tmp, listen="127.0.0.1:0", extra=()):
    env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "posix,sysv,cma,tcp,self"))
    os.environ["UCX_TLS"] = env["UCX_TLS"]
    ports = os.path.join(tmp, "kvs.ports")
    if os.path.exists(ports):
        os.unlink(ports)
    kvs = subprocess.Popen([wh.KVSTORE, "--listen=" + listen, "--dataplane-listen=127.0.0.1:0",
                            "--metrics-listen=127.0.0.1:0", "--insecure-admin", "--memory=512MiB", "--no-hugepages",
                            "--drain-timeout-ms=3000", "--port-file=" + ports, *extra],
                           stdout=open(os.path.join(tmp, "kvstore.log"), "ab"), stderr=subprocess.STDOUT, env=env)
    for _ in range(1500):
        if os.path.exists(ports) and "grpc=" in open(ports).read():
            break
        if kvs.poll() is not None:
            raise SystemExit("ri-kvstore exited %d" % kvs.returncode)
        time.sleep(0.01)
    grpc = dict(l.split("=", 1) for l in open(ports).read().split("\n") if "=" in l)["grpc"]
    return kvs, grpc


def ask(w, attn, question, kind="completion", max_tokens=12, model=wh.MODEL_ID, doc=DOC):
    """(text, usage) of one greedy request; kind: completion, chat, stream."""
    if kind == "chat":
        body = wh.chat(doc + question, max_tokens=max_tokens, attn=attn, model=model)
        st, _, c = w.request("POST", "/v1/chat/completions", body)
        check(st == 200, "chat answers (%d)" % st)
        return c["choices"][0]["message"]["content"], c["usage"]
    body = wh.completion(doc + question, max_tokens=max_tokens, attn=attn, model=model)
    if kind == "stream":
        st, _, ev = w.stream("/v1/completions", dict(body, stream_options={"include_usage": True}))
        check(st == 200 and ev[-1] == "[DONE]", "stream answers (%d)" % st)
        usage = [e["usage"] for e in ev[:-1] if e.get("usage")]
        return wh.stream_text(ev, False), usage[-1] if usage else {}
    st, _, c = w.request("POST", "/v1/completions", body)
    check(st == 200, "completion answers (%d)" % st)
    return c["choices"][0]["text"], c["usage"]


def cached(u):
    return u.get("prompt_tokens_details", {}).get("cached_tokens", -1)


def run_same_twice(tmp, attn):
    kvs, grpc = start_kvstore(tmp)
    try:
        ref = wh.Worker("--kvstore", grpc, "--attn", attn, "--no-prefix-cache", tmp=tmp)
        try:
            want = {k: ask(ref, attn, QUESTIONS[0], k)[0] for k in ("completion", "chat")}
            _, u = ask(ref, attn, QUESTIONS[0])
            check(cached(u) == 0, "--no-prefix-cache: nothing cached (%s)" % u)
        finally:
            ref.stop()
        w = wh.Worker("--kvstore", grpc, "--attn", attn, tmp=tmp)
        try:
            t1, u1 = ask(w, attn, QUESTIONS[0])
            check(u1["prompt_tokens"] > 1200 and cached(u1) == 0,
                  "first time: %d prompt tokens, none cached (%s)" % (u1["prompt_tokens"], u1))
            check(t1 == want["completion"], "first answer equals the reference (%r vs %r)" % (t1, want["completion"]))
            m = w.metrics()
            check(m.get("ri_worker_prefix_published_blocks_total", 0) >= 4,
                  "the prompt's blocks were published (%s)" % m.get("ri_worker_prefix_published_blocks_total"))
            up = "ri_worker_kvstore_uploaded_bytes_total"
            first_up = m.get(up, 0)
            _, u = ask(w, attn, QUESTIONS[0], "chat")  # its template's tokens differ: a first time too
            check(cached(u) == 0, "chat, first time: nothing cached (%s)" % u)
            for kind in ("completion", "stream", "chat"):
                before = w.metrics().get(up, 0)
                t, u = ask(w, attn, QUESTIONS[0], kind)
                if attn == "retroinfer-remote":  # the session imported the blocks: it uploads only the rest
                    again = w.metrics().get(up, 0) - before
                    check(0 < first_up and again < first_up / 2,
                          "%s: uploaded %d bytes, the first time %d" % (kind, again, first_up))
                check(cached(u) >= 1024 and cached(u) % 256 == 0 and cached(u) < u["prompt_tokens"],
                      "%s: again, cached_tokens %d of %d" % (kind, cached(u), u["prompt_tokens"]))
                ref_text = want["chat" if kind == "chat" else "completion"]
                check(t == ref_text, "%s: same greedy text as without the cache (%r vs %r)" % (kind, t, ref_text))
            m = w.metrics()
            check(m.get("ri_worker_prefix_lookups_total", 0) >= 5 and
                  m.get("ri_worker_prefix_hit_tokens_total", 0) >= 2048 and
                  m.get("ri_worker_prefill_tokens_saved_total", 0) == m.get("ri_worker_prefix_hit_tokens_total") and
                  m.get("ri_worker_prefix_attached_bytes_total", 0) > 0 and
                  m.get("ri_worker_prefix_fallbacks_total", -1) == 0 and
                  # a shared meta index lives as long as a sequence reads it: none once the requests ended
                  m.get("ri_worker_prefix_meta_shared_copies", -1) == 0 and
                  m.get("ri_worker_prefix_meta_shared_bytes", -1) == 0,
                  "metrics: lookups, hits, saved tokens, attached bytes, no fallback, no shared index left (%s)" %
                  {k: v for k, v in m.items() if "prefix" in k or "saved" in k})
            tags = {k: v for k, v in m.items() if k.startswith('ri_worker_alloc_bytes{tag="')}
            check(len(tags) >= 3 and all(v >= 0 for v in tags.values()) and sum(tags.values()) > 0,
                  "metrics: live heap bytes by allocation tag (%d tags, %.0f bytes)" % (len(tags), sum(tags.values())))
            # the kvstore gone: the request is prefilled whole, answers the same, and the failure is counted
            # (not for retroinfer-remote, whose attention itself lives in the kvstore)
            if attn != "retroinfer-remote":
                kvs.terminate()
                kvs.wait(30)
                t, u = ask(w, attn, QUESTIONS[0])
                m = w.metrics()
                check(t == want["completion"] and cached(u) == 0 and m.get("ri_worker_prefix_fallbacks_total", 0) >= 1,
                      "kvstore gone: same text, nothing cached, a fallback counted (%s, %s)" %
                      (u, m.get("ri_worker_prefix_fallbacks_total")))
        finally:
            check(w.stop() == 0, "SIGTERM -> exit 0")
    finally:
        if kvs.poll() is None:
            kvs.terminate()
            kvs.wait(30)


def test_full(tmp):
    run_same_twice(tmp, "full")


def test_retroinfer(tmp):
    run_same_twice(tmp, "retroinfer")


def test_remote(tmp):
    run_same_twice(tmp, "retroinfer-remote")


def test_prime(tmp, attn):
    kvs, grpc = start_kvstore(tmp)
    try:
        ref = wh.Worker("--kvstore", grpc, "--attn", attn, "--no-prefix-cache", tmp=tmp)
        try:
            want1 = ask(ref, attn, QUESTIONS[0], max_tokens=1)[0]
            want = ask(ref, attn, QUESTIONS[0])[0]
        finally:
            ref.stop()
        w = wh.Worker("--kvstore", grpc, "--attn", attn, tmp=tmp)
        try:
            t, u = ask(w, attn, QUESTIONS[0], max_tokens=1)
            check(cached(u) == 0 and u["completion_tokens"] == 1 and t == want1,
                  "max_tokens 1: one token, the reference's (%r vs %r, %s)" % (t, want1, u))
            m = w.metrics()
            check(m.get("ri_worker_prefix_published_blocks_total", 0) >= 4,
                  "max_tokens 1 published the prompt's blocks (%s)" % m.get("ri_worker_prefix_published_blocks_total"))
            t, u = ask(w, attn, QUESTIONS[0])
            check(cached(u) >= 1024 and cached(u) % 256 == 0,
                  "after the warm-up: cached_tokens %d of %d" % (cached(u), u["prompt_tokens"]))
            check(t == want, "same greedy text as without the cache (%r vs %r)" % (t, want))
        finally:
            check(w.stop() == 0, "SIGTERM -> exit 0")
    finally:
        kvs.terminate()
        kvs.wait(30)


def test_gemma_remote(tmp):
    attn, model = "retroinfer-remote", "gemma3-270m"
    doc = DOC + " " + DOC.replace("Ship", "Boat")  # Gemma's tokens are fewer: room for several blocks
    kvs, grpc = start_kvstore(tmp)
    try:
        ref = wh.Worker("--kvstore", grpc, "--model", model, "--attn", attn, "--no-prefix-cache", tmp=tmp)
        try:
            model_id = ref.request("GET", "/v1/models")[2]["data"][0]["id"]
            want = ask(ref, attn, QUESTIONS[0], model=model_id, doc=doc)[0]
        finally:
            ref.stop()
        w = wh.Worker("--kvstore", grpc, "--model", model, "--attn", attn, tmp=tmp)
        try:
            t1, u1 = ask(w, attn, QUESTIONS[0], model=model_id, doc=doc)
            check(u1["prompt_tokens"] >= 1500 and cached(u1) == 0 and t1 == want,
                  "first time: %d prompt tokens, none cached, the reference's text (%r vs %r)" %
                  (u1["prompt_tokens"], t1, want))
            t, u = ask(w, attn, QUESTIONS[0], model=model_id, doc=doc)
            check(cached(u) >= 1024 and cached(u) % 256 == 0,
                  "again: cached_tokens %d of %d" % (cached(u), u["prompt_tokens"]))
            check(t == want, "again: same greedy text as without the cache (%r vs %r)" % (t, want))
            print("gemma3-270m: %d prompt tokens, %d cached the second time, text %r" %
                  (u["prompt_tokens"], cached(u), t))
        finally:
            check(w.stop() == 0, "SIGTERM -> exit 0")
    finally:
        kvs.terminate()
        kvs.wait(30)


def stream_until(w, attn, n, on_n, max_tokens):
    """A streamed greedy completion of DOC + QUESTIONS[0]; on_n() runs once
    after n text pieces.  (text, usage)."""
    body = dict(wh.completion(DOC + QUESTIONS[0], max_tokens=max_tokens, attn=attn),
                stream=True, stream_options={"include_usage": True})
    c = w.conn(timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    check(r.status == 200, "stream answers (%d)" % r.status)
    pieces, usage, fired = [], {}, False
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        check("error" not in ev, "no error event (%s)" % ev.get("error"))
        usage = ev.get("usage") or usage
        if ev.get("choices") and ev["choices"][0].get("text"):
            pieces.append(ev["choices"][0]["text"])
        if len(pieces) >= n and not fired:
            fired = True
            on_n()
    c.close()
    return "".join(pieces), usage


def test_kill_remote(tmp):
    attn = "retroinfer-remote"
    spill = os.path.join(tmp, "spill")
    os.mkdir(spill)
    extra = ("--spill-dir=" + spill, "--recover", "--session-lease-ms=60000")
    kvs, grpc = start_kvstore(tmp, extra=extra)
    os.environ.setdefault("RI_WORKER_DIRECT", "false")  # every step two-sided: the decode sees the kill at once
    w = None
    try:
        ref = wh.Worker("--kvstore", grpc, "--attn", attn, "--no-prefix-cache", tmp=tmp)
        try:
            want = ask(ref, attn, QUESTIONS[0], max_tokens=24)[0]
        finally:
            ref.stop()
        w = wh.Worker("--kvstore", grpc, "--attn", attn, "--timeout-ms", "2000", tmp=tmp)
        _, u = ask(w, attn, QUESTIONS[0], max_tokens=1)  # publishes the document's blocks
        box = {}

        def restart():
            kvs.kill()
            kvs.wait(30)
            box["kvs"] = start_kvstore(tmp, listen=grpc, extra=extra)[0]
        t, u = stream_until(w, attn, 6, restart, 24)
        kvs = box.get("kvs", kvs)
        check(cached(u) >= 1024, "the stream attached the blocks (%s)" % u)
        check(t == want,
              "killed mid-answer: the stream ends with the reference's text (%r vs %r, %s)" % (t, want, u))
        m = w.metrics()
        check(m.get("ri_worker_sequences_rebuilt_total", 0) >= 1, "the sequence was rebuilt (%s)" %
              m.get("ri_worker_sequences_rebuilt_total"))
        # the rebuild published the blocks the crash lost: a new request finds them
        t, u = ask(w, attn, QUESTIONS[0], max_tokens=24)
        check(t == want, "after the restart, the same document: the reference's text (%r vs %r)" % (t, want))
        check(cached(u) >= 1024, "after the restart, the same document is cached again (%s)" % u)
    finally:
        if w is not None:
            check(w.stop() == 0, "SIGTERM -> exit 0")
        if kvs.poll() is None:
            kvs.terminate()
            kvs.wait(30)


def test_lines(tmp):
    kvs, grpc = start_kvstore(tmp)
    try:
        def lines(*extra):
            req = {"prompt": DOC + QUESTIONS[0], "max_tokens": 12, "attn": "full", "compare_attn": "retroinfer"}
            inp = "".join(json.dumps(dict(req, id=i)) + "\n" for i in (1, 2))
            out = subprocess.run([wh.WORKER, "--threads", "2", "--kvstore", grpc, *extra], input=inp,
                                 capture_output=True, text=True, timeout=240)
            with open(os.path.join(tmp, "worker.log"), "a") as f:
                f.write(out.stderr)
            check(out.returncode == 0, "ri-worker %s exits 0 (%d)" % (" ".join(extra), out.returncode))
            return [json.loads(l) for l in out.stdout.splitlines()]
        r = lines()
        check(len(r) == 2 and all(x["ok"] and len(x["runs"]) == 2 for x in r), "two replies, two runs each (%s)" %
              [(x.get("ok"), x.get("error")) for x in r])
        first, again = r
        check(first["prompt_tokens"] > 1200 and first["cached_tokens"] == 0,
              "first time: %d prompt tokens, none cached" % first["prompt_tokens"])
        check(again["cached_tokens"] >= 1024 and again["cached_tokens"] % 256 == 0 and
              again["cached_tokens"] < again["prompt_tokens"],
              "again: cached_tokens %d of %d" % (again["cached_tokens"], again["prompt_tokens"]))
        for i, attn in enumerate(("full", "retroinfer")):
            a, b = first["runs"][i], again["runs"][i]
            check(a["attn"] == attn and b["attn"] == attn and a["tokens"] == 12 and a["decode_steps"] == 11,
                  "run %d: %s, 12 tokens, 11 decode steps (%s)" % (i, attn, {k: a[k] for k in ("attn", "tokens",
                                                                                                "decode_steps")}))
            check(a["text"] and a["text"] == b["text"], "run %d (%s): same greedy text with the cache (%r vs %r)" %
                  (i, attn, b["text"], a["text"]))
        off = lines("--no-prefix-cache")
        check([x.get("cached_tokens") for x in off] == [0, 0], "--no-prefix-cache: nothing cached (%s)" %
              [x.get("cached_tokens") for x in off])
        check([x["runs"][0]["text"] for x in off] == [first["runs"][0]["text"]] * 2,
              "--no-prefix-cache: the same text")
    finally:
        kvs.terminate()
        kvs.wait(30)


def test_two(tmp, attn="retroinfer"):
    kvs, grpc = start_kvstore(tmp)
    try:
        ref = wh.Worker("--kvstore", grpc, "--attn", attn, "--no-prefix-cache", tmp=tmp)
        try:
            want = [ask(ref, attn, q)[0] for q in QUESTIONS]
        finally:
            ref.stop()
        a = wh.Worker("--kvstore", grpc, "--attn", attn, tmp=tmp)
        b = wh.Worker("--kvstore", grpc, "--attn", attn, tmp=tmp)
        try:
            t, u = ask(a, attn, QUESTIONS[0])
            check(cached(u) == 0 and t == want[0], "worker A prefills and publishes (%s)" % u)
            out = [None, None]

            def one(i, w):
                out[i] = ask(w, attn, QUESTIONS[i])
            th = [threading.Thread(target=one, args=(i, w)) for i, w in ((1, b), (0, a))]
            for x in th:
                x.start()
            for x in th:
                x.join(300)
            check(out[1] is not None and cached(out[1][1]) >= 1024,
                  "worker B reuses A's blocks (%s)" % (out[1] and out[1][1]))
            for i in range(2):
                check(out[i] is not None and out[i][0] == want[i],
                      "question %d: same text as the reference (%r vs %r)" % (i, out[i] and out[i][0], want[i]))
        finally:
            check(a.stop() == 0 and b.stop() == 0, "both exit 0")
    finally:
        kvs.terminate()
        kvs.wait(30)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "full"
    if not os.path.exists(wh.MODEL):
        print("skip: no model at %s" % wh.MODEL)
        return 77
    if mode == "gemma-remote" and not os.path.exists(os.path.join(os.path.dirname(wh.MODEL), GEMMA_FILE)):
        print("skip: no Gemma 3 270M model next to %s" % wh.MODEL)
        return 77
    if not os.access(wh.WORKER, os.X_OK) or not os.access(wh.KVSTORE, os.X_OK):
        print("skip: ri-worker / ri-kvstore not built in %s" % wh.BUILD)
        return 77
    with tempfile.TemporaryDirectory(prefix="ri-prefix-") as tmp:
        try:
            {"full": test_full, "retroinfer": test_retroinfer, "two": test_two, "remote": test_remote,
             "two-remote": lambda t: test_two(t, "retroinfer-remote"),
             "prime": lambda t: test_prime(t, "retroinfer"),
             "prime-remote": lambda t: test_prime(t, "retroinfer-remote"),
             "gemma-remote": test_gemma_remote, "kill-remote": test_kill_remote, "lines": test_lines}[mode](tmp)
        except Exception as e:
            check(False, "%s: %s" % (type(e).__name__, e))
        finally:
            log = os.path.join(tmp, "worker.log")
            if wh.failures and os.path.exists(log):
                print("--- ri-worker log (tail) ---")
                print(open(log, errors="replace").read()[-3000:])
    if wh.failures:
        print("%d check(s) failed" % len(wh.failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
