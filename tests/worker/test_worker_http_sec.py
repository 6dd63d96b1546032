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


def raw_post(w, body, timeout=30):
    """(status, parsed body, seconds) of a POST /v1/completions with raw bytes."""
    c = w.conn(timeout)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    payload = r.read()
    c.close()
    return r.status, json.loads(payload), time.monotonic() - t0


def peak_rss_mb(w):
    for line in open("/proc/%d/status" % w.proc.pid):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0


def test_input(tmp):
    """Before the fix: the NUL prompt answered 200 (the prompt cut at the
    NUL), the invalid UTF-8 body 200, and the million token ids 400 only
    after parsing them all (1.4 s and 80 MB measured on an idle machine;
    here 0.25 s and +83 MB: the peak memory check failed)."""
    w = wh.Worker(tmp=tmp)
    try:
        st, c, _ = raw_post(w, json.dumps(completion("ab\u0000cd")).encode())
        check(st == 400 and "NUL" in c["error"]["message"] and c["error"]["type"] == "invalid_request_error",
              "a NUL in the prompt -> 400 (%d %s)" % (st, c))
        st, c, _ = raw_post(w, b'{"model": "%s", "prompt": "ab\xff\xfecd", "max_tokens": 2}' %
                            wh.MODEL_ID.encode())
        check(st == 400 and "UTF-8" in c["error"]["message"], "invalid UTF-8 in the body -> 400 (%d %s)" % (st, c))
        st, c, _ = raw_post(w, json.dumps(completion("caf\u00e9 \u2014 ok")).encode())
        check(st == 200, "valid non-ASCII text still answers (%d)" % st)
        st, c, _ = raw_post(w, json.dumps(completion("a\\u0000b")).encode())
        check(st == 200, "an escaped backslash before u0000 is text, not a NUL (%d)" % st)
        big = json.dumps(completion([1] * 1000000)).encode()
        hwm0 = peak_rss_mb(w)
        st, c, dt = raw_post(w, big)
        grew = peak_rss_mb(w) - hwm0
        # the 2.9 MB body itself is buffered (twice at most while it grows); cJSON's nodes would be ~80 MB
        check(st == 400 and c["error"]["code"] == "context_length_exceeded" and grew < 24 and dt < 1,
              "a million token ids -> 400 context_length_exceeded in %.3f s, peak memory +%.0f MB (%d %s)" %
              (dt, grew, st, c))
        st, _, _ = w.request("GET", "/health")
        check(st == 200, "/health after the bad bodies")
    finally:
        rc = w.stop()
    check(rc == 0, "SIGTERM -> exit 0 (%s)" % rc)


class Trickler:
    """n connections that each send a request line, then one header line
    every `every` seconds, and never finish (slowloris)."""

    def __init__(self, w, n, every=0.3):
        self.socks, self.stop, self.every = [], threading.Event(), every
        for _ in range(n):
            try:
                s = socket.create_connection((w.host, int(w.port)), timeout=2)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                self.socks.append(s)
            except OSError:
                pass  # refused at once: fine, it holds nothing
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.wait(self.every):
            for s in self.socks:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass

    def closed(self):
        """How many of the connections the server closed."""
        n = 0
        for s in self.socks:
            try:
                s.settimeout(0.01)
                n += s.recv(1) == b""
            except socket.timeout:
                pass
            except OSError:
                n += 1
        return n

    def end(self):
        self.stop.set()
        self.t.join()
        for s in self.socks:
            s.close()


def retry(fn, within):
    """fn() until it returns a status or within seconds pass: (status, seconds)."""
    t0 = time.monotonic()
    while True:
        try:
            return fn(), time.monotonic() - t0
        except OSError:
            if time.monotonic() - t0 > within:
                return None, time.monotonic() - t0
            time.sleep(0.05)


def test_slowloris(tmp):
    """Before the fix (same limits but no deadline, reserve or per-address
    cap): the 40 tricklers held all 24 slots, /health got "connection reset"
    for the whole 2 s, the completion too, and no connection was ever closed
    while bytes kept coming."""
    w = wh.Worker("--http-max-conn", "24", "--http-reserve-conn", "4", "--http-max-conn-per-addr", "20",
                  "--http-request-timeout-ms", "2000", tmp=tmp)
    try:
        t0 = time.monotonic()
        slow = Trickler(w, 40)
        time.sleep(0.3)

        def health():
            c = w.conn(timeout=2)
            c.request("GET", "/health")
            st = c.getresponse().status
            c.close()
            return st
        st, dt = retry(health, 2)
        check(st == 200 and dt < 2, "/health answers under slowloris (%s in %.2f s)" % (st, dt))
        st, dt = retry(lambda: w.request("POST", "/v1/completions", completion("The capital of France is"))[0], 3)
        check(st == 200, "a completion answers under slowloris (%s in %.2f s)" % (st, dt))
        time.sleep(max(0, t0 + 2.6 - time.monotonic()))
        closed = slow.closed()
        check(closed == len(slow.socks), "every trickling connection closed by its deadline (%d of %d), although "
              "each sent a byte every 0.3 s" % (closed, len(slow.socks)))
        slow.end()
        m = w.metrics()
        why = {r: m.get('ri_worker_http_connections_closed_total{reason="%s"}' % r, 0)
               for r in ("request_deadline", "reserve_deadline", "evicted", "refused")}
        # 20 regular slots cut at their deadline; the others went through the 4 reserve slots (evicted or cut
        # at 1 s) or were refused by libmicrohttpd's per-address limit before the guard saw them (uncounted)
        check(why["request_deadline"] >= 20 and why["evicted"] + why["reserve_deadline"] >= 4,
              "/metrics counts the closed connections by reason (%s)" % why)
        st, _, _ = w.request("GET", "/health")
        check(st == 200, "/health after the attack")
    finally:
        rc = w.stop()
    check(rc == 0, "SIGTERM -> exit 0 (%s)" % rc)


def keyed(w, method, path, key=None, body=None, auth=None):
    """(status, headers, parsed JSON or text) with an API key (or a raw Authorization value)."""
    c = w.conn(30)
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    if key is not None or auth is not None:
        hdrs["Authorization"] = auth if auth is not None else "Bearer " + key
    c.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=hdrs)
    r = c.getresponse()
    payload = r.read()
    c.close()
    return r.status, r, json.loads(payload) if "json" in r.getheader("Content-Type", "") else payload.decode()


def write_keys(path, *keys, mode=0o600):
    with open(path + ".tmp", "w") as f:
        f.write("# test keys\n" + "".join("%s client%d\n" % (k, i) for i, k in enumerate(keys)))
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def wait_log(tmp, text, seconds=10):
    end = time.time() + seconds
    while time.time() < end:
        if text in open(os.path.join(tmp, "worker.log"), errors="replace").read():
            return True
        time.sleep(0.05)
    return False


def test_auth(tmp):
    """Before the fix: there were no keys (--api-keys-file unknown, exit 2);
    run without it, every endpoint answered 200 to anyone, and --listen
    0.0.0.0:0 started serving without a word."""
    key_a, key_b = "ka-" + os.urandom(16).hex(), "kb-" + os.urandom(16).hex()
    keys = os.path.join(tmp, "api-keys")
    write_keys(keys, key_a)
    w = wh.Worker("--api-keys-file", keys, tmp=tmp)
    try:
        st, _, _ = keyed(w, "GET", "/health")
        check(st == 200, "/health needs no key (load balancers)")
        st, r, c = keyed(w, "GET", "/v1/models")
        check(st == 401 and c["error"]["code"] == "invalid_api_key" and c["error"]["type"] == "invalid_request_error"
              and "Bearer" in (r.getheader("WWW-Authenticate") or ""), "no key -> 401, OpenAI's error body (%s)" % c)
        st, _, c = keyed(w, "GET", "/v1/models", key=key_b)
        check(st == 401 and "incorrect" in c["error"]["message"], "a wrong key -> 401 (%s)" % c)
        st, _, c = keyed(w, "GET", "/v1/models", auth="Basic " + key_a)
        check(st == 401, "another scheme -> 401 (%s)" % c)
        st, _, c = keyed(w, "POST", "/v1/completions", body=completion("The capital of France is"))
        check(st == 401, "a completion without a key -> 401")
        st, _, c = keyed(w, "POST", "/v1/completions", key=key_a, body=completion("The capital of France is"))
        check(st == 200 and c["choices"][0]["text"] != "", "a completion with the key -> 200")
        st, _, _ = keyed(w, "GET", "/metrics")
        check(st == 401, "/metrics without a key -> 401")
        st, _, text = keyed(w, "GET", "/metrics", key=key_a)
        check(st == 200 and 'endpoint="/v1/models",code="401"} 3' in text, "/metrics with the key counts the 401s")
        try:
            import openai
        except ImportError:
            openai = None
        if openai is not None:
            cl = openai.OpenAI(base_url="http://%s/v1" % w.addr, api_key=key_a, max_retries=0, timeout=60)
            got = cl.completions.create(model=wh.MODEL_ID, prompt="The capital of France is", max_tokens=4,
                                        temperature=0)
            check(got.choices[0].text != "", "the openai client's api_key works")
            try:
                openai.OpenAI(base_url="http://%s/v1" % w.addr, api_key=key_b, max_retries=0).models.list()
                check(False, "the openai client with a wrong key raises")
            except openai.AuthenticationError as e:
                check(e.status_code == 401 and e.code == "invalid_api_key", "openai client: AuthenticationError")
        else:
            print("note: the openai package is not installed; its api_key is not checked")
        write_keys(keys, key_b)
        w.proc.send_signal(signal.SIGHUP)
        check(wait_log(tmp, "SIGHUP: 1 API key(s) loaded"), "SIGHUP reloads the keys file")
        st_a = keyed(w, "GET", "/v1/models", key=key_a)[0]
        st_b = keyed(w, "GET", "/v1/models", key=key_b)[0]
        check(st_a == 401 and st_b == 200, "after the reload the old key is refused, the new one works (%d %d)" %
              (st_a, st_b))
        write_keys(keys, key_a, mode=0o666)
        w.proc.send_signal(signal.SIGHUP)
        check(wait_log(tmp, "the keys loaded before stay in force"), "a world-writable keys file is refused")
        check(keyed(w, "GET", "/v1/models", key=key_b)[0] == 200, "... and the keys in force stay")
    finally:
        rc = w.stop()
    check(rc == 0, "SIGTERM -> exit 0 (%s)" % rc)
    p = subprocess.run([wh.WORKER, "--listen", "0.0.0.0:0", "--threads", "1"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    check(p.returncode == 2 and b"--api-keys-file" in p.stderr and b"--insecure" in p.stderr,
          "a non-loopback --listen without keys -> exit 2 (%d, %s)" % (p.returncode, p.stderr[-200:]))


MODES = {"short": test_short, "input": test_input, "slowloris": test_slowloris, "auth": test_auth}


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
