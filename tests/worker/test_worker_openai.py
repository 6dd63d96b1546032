#!/usr/bin/env python3
"""ri-worker's HTTP service through the official `openai` Python client.

test_worker_http.py checks the wire format with the standard library; this
test checks what users run: the `openai` package (a test-only dependency,
deps/setup.d/20-pytest-deps.sh) against a real `ri-worker --listen` with the
real default model and a real ri-kvstore, so the default backend is
retroinfer-remote.  It
  - lists the models (client.models.list),
  - streams a chat completion over a long prompt (the kvstore path really
    runs: the worker's /metrics shows uploads and fetches) and checks the
    chunks the client parsed: role first, text, finish_reason, usage last,
    and the streamed text equal to the non-streamed one (greedy),
  - makes a non-streaming completion,
  - sees the client raise its typed errors with OpenAI's error fields for an
    unknown model (404) and a bad sampling value (400).
Exits 77 (skipped) without the openai package, the model or the binaries.
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_worker_http as wh  # noqa: E402  the Worker process helper, paths, check()

try:
    import openai
except ImportError:
    openai = None

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# Long enough (> 1,000 tokens) that retroinfer indexes it and fetches from the kvstore.
LONG = ("There is an important info hidden inside a lot of irrelevant text." + FILLER * 60 +
        " The pass key is 52817. Remember it." + FILLER * 5 + " What is the pass key?")


def start_kvstore(tmp):
    """A real ri-kvstore on free loopback ports; returns (process, gRPC address)."""
    import subprocess
    ports = os.path.join(tmp, "kvs.ports")
    kvs = subprocess.Popen([wh.KVSTORE, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0",
                            "--metrics-listen=127.0.0.1:0", "--insecure-admin", "--memory=512MiB", "--no-hugepages",
                            "--drain-timeout-ms=3000", "--port-file=" + ports],
                           stdout=open(os.path.join(tmp, "kvstore.log"), "wb"), stderr=subprocess.STDOUT)
    for _ in range(1500):
        if os.path.exists(ports):
            keys = dict(l.split("=", 1) for l in open(ports).read().split("\n") if "=" in l)
            if "grpc" in keys:
                return kvs, keys["grpc"]
        if kvs.poll() is not None:
            raise SystemExit("ri-kvstore exited %d" % kvs.returncode)
        time.sleep(0.01)
    kvs.kill()
    raise SystemExit("ri-kvstore wrote no port file")


def run(tmp):
    check = wh.check
    kvs, grpc = start_kvstore(tmp)
    try:
        w = wh.Worker("--kvstore", grpc, tmp=tmp)
        try:
            client = openai.OpenAI(base_url="http://%s/v1" % w.addr, api_key="unused", max_retries=0, timeout=240)
            ids = [m.id for m in client.models.list()]
            check(ids == [wh.MODEL_ID], "models.list() -> %r" % ids)

            msgs = [{"role": "user", "content": LONG}]
            stream = client.chat.completions.create(model=wh.MODEL_ID, messages=msgs, max_tokens=12, temperature=0,
                                                    stream=True, stream_options={"include_usage": True})
            chunks = list(stream)
            with_choices = [c for c in chunks if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in with_choices)
            check(len(with_choices) >= 3 and all(c.object == "chat.completion.chunk" for c in chunks) and
                  len({c.id for c in chunks}) == 1, "chat stream: %d chunks, one id" % len(chunks))
            check(with_choices[0].choices[0].delta.role == "assistant", "chat stream: the role comes first")
            check(with_choices[-1].choices[0].finish_reason in ("stop", "length") and
                  all(c.choices[0].finish_reason is None for c in with_choices[:-1]),
                  "chat stream: finish_reason on the last choice only")
            u = chunks[-1].usage
            check(u is not None and u.prompt_tokens > 1000 and 1 <= u.completion_tokens <= 12 and
                  u.total_tokens == u.prompt_tokens + u.completion_tokens,
                  "chat stream: the usage chunk last (%s)" % u)
            check("52817" in text, "chat stream: the pass key found through the kvstore (%r)" % text)
            m = w.metrics()
            check(m.get("ri_worker_kvstore_uploaded_bytes_total", 0) > 0 and
                  m.get("ri_worker_kvstore_cache_hits_total", 0) + m.get("ri_worker_kvstore_cache_misses_total", 0)
                  + m.get("ri_worker_kvstore_direct_clusters_total", 0) > 0,
                  "the stream went through the kvstore (uploads, and clusters read from it, in /metrics)")

            whole = client.chat.completions.create(model=wh.MODEL_ID, messages=msgs, max_tokens=12, temperature=0)
            check(whole.choices[0].message.content == text and whole.object == "chat.completion",
                  "chat, not streamed: the streamed text (%r)" % whole.choices[0].message.content)

            c = client.completions.create(model=wh.MODEL_ID, prompt="The capital of France is", max_tokens=8,
                                          temperature=0, extra_body={"attn": "full"})
            check(c.object == "text_completion" and c.choices[0].text.strip() != "" and
                  c.usage.completion_tokens >= 1, "completion (attn full via extra_body): %r" % c.choices[0].text)

            try:
                client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
                check(False, "unknown model raises")
            except openai.NotFoundError as e:
                check(e.status_code == 404 and e.code == "model_not_found" and e.param == "model",
                      "unknown model -> NotFoundError 404, code model_not_found (%s)" % e)
            try:
                client.completions.create(model=wh.MODEL_ID, prompt="x", temperature=7)
                check(False, "temperature 7 raises")
            except openai.BadRequestError as e:
                check(e.status_code == 400 and e.param == "temperature" and e.type == "invalid_request_error",
                      "temperature 7 -> BadRequestError 400 naming the param (%s)" % e)
        finally:
            rc = w.stop()
        check(rc == 0, "SIGTERM -> exit 0 (%s)" % rc)
    finally:
        kvs.terminate()
        kvs.wait(30)


def main():
    if openai is None:
        print("skip: the openai package is not installed (deps/setup.d/20-pytest-deps.sh installs it)")
        return 77
    if not os.path.exists(wh.MODEL):
        print("skip: no model at %s" % wh.MODEL)
        return 77
    if not (os.access(wh.WORKER, os.X_OK) and os.access(wh.KVSTORE, os.X_OK)):
        print("skip: ri-worker / ri-kvstore not built in %s" % wh.BUILD)
        return 77
    os.environ.setdefault("UCX_TLS", "posix,sysv,cma,tcp,self")  # same host: shared memory
    with tempfile.TemporaryDirectory(prefix="ri-openai-") as tmp:
        try:
            run(tmp)
        except Exception as e:  # a dead worker shows as a connection error: show its log too
            wh.check(False, "%s: %s" % (type(e).__name__, e))
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
