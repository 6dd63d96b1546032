"""HTTP checks of test_compose.sh against the stack's front door and the
kvstore's /metrics (standard library only).

  compose_client.py models URL          the one model is listed
  compose_client.py complete URL N      N greedy completions; all the same text, printed
  compose_client.py remote URL          a ~1.3K-token prompt on retroinfer-remote
  compose_client.py metric URL NAME     a Prometheus metric of URL, summed over its labels
  compose_client.py stream URL N [K CMD] the ~1.3K-token prompt on retroinfer-remote, streamed, N
                                        greedy tokens; its text printed.  With K and CMD: after K
                                        tokens run the shell command CMD (it kills the kvstore
                                        holding the session) and report how long the next token took

The workers' API key comes from RI_API_KEY.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

MODEL = None


def call(url, body=None, timeout=300):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if os.environ.get("RI_API_KEY") and "/v1/" in url:  # the workers' API key (the kvstore's /metrics has none)
        headers["Authorization"] = "Bearer " + os.environ["RI_API_KEY"]
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        if r.status != 200:
            sys.exit(f"FAIL: {url}: HTTP {r.status}: {raw[:300]!r}")
        return raw


def model(base):
    global MODEL
    if MODEL is None:
        got = json.loads(call(base + "/v1/models"))
        assert got["object"] == "list" and len(got["data"]) == 1, got
        MODEL = got["data"][0]["id"]
    return MODEL


def complete(base, prompt, attn, max_tokens):
    body = {"model": model(base), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "attn": attn}
    got = json.loads(call(base + "/v1/completions", body))
    assert got["object"] == "text_completion" and got["usage"]["completion_tokens"] >= 1, got
    return got["choices"][0]["text"]


PASSKEY_FILL = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it." +
           PASSKEY_FILL * 27 + " The pass key is 52817. Remember it. 52817 is the pass key." + PASSKEY_FILL * 27 +
           " What is the pass key? The pass key is")


def stream(base, n, kill_after=None, cmd=None):
    """A streamed greedy completion; runs cmd after kill_after token events."""
    body = {"model": model(base), "prompt": PASSKEY, "max_tokens": n, "temperature": 0, "attn": "retroinfer-remote",
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    headers = {"Content-Type": "application/json"}
    if os.environ.get("RI_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["RI_API_KEY"]
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
    text, events, t_kill, gap, used = "", 0, None, None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            ev = json.loads(line[5:])
            if ev.get("error"):
                sys.exit(f"FAIL: error event after {events} tokens: {ev['error']}")
            if ev.get("usage"):
                used = ev["usage"].get("completion_tokens")
            if not ev.get("choices"):
                continue
            if ev["choices"][0].get("finish_reason") is not None:  # the closing event: no token
                text += ev["choices"][0].get("text") or ""
                continue
            if t_kill is not None and gap is None:
                gap = time.time() - t_kill
            text += ev["choices"][0].get("text") or ""
            events += 1
            if cmd and events == kill_after:
                subprocess.run(cmd, shell=True, check=True)
                t_kill = time.time()
    # (the server may send two tokens in one event when both are ready: count
    # the tokens it reports, not the events)
    if used != n:
        sys.exit(f"FAIL: {used} tokens generated ({events} events), wanted {n}")
    if cmd:
        if gap is None:
            sys.exit("FAIL: no token after the kill")
        print(f"the next token came {gap:.2f} s after the kill", file=sys.stderr)
    return text


def main():
    cmd, base = sys.argv[1], sys.argv[2].rstrip("/")
    if cmd == "models":
        print(f"model {model(base)}", file=sys.stderr)
    elif cmd == "complete":
        texts = {complete(base, "The capital of France is", "full", 8) for _ in range(int(sys.argv[3]))}
        if len(texts) != 1:
            sys.exit(f"FAIL: greedy completions differ: {texts}")
        print(json.dumps(texts.pop()))
    elif cmd == "remote":
        f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
        prompt = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it." +
                  f * 27 + " The pass key is 52817. Remember it. 52817 is the pass key." + f * 27 +
                  " What is the pass key? The pass key is")
        print("retroinfer-remote:", json.dumps(complete(base, prompt, "retroinfer-remote", 6)), file=sys.stderr)
    elif cmd == "stream":
        k = int(sys.argv[4]) if len(sys.argv) > 5 else None
        print(json.dumps(stream(base, int(sys.argv[3]), k, sys.argv[5] if k else None)))
    elif cmd == "metric":
        name = sys.argv[3]
        text = call(base).decode()
        print(int(sum(float(line.split()[-1]) for line in text.splitlines()
                      if line.split("{")[0].split(" ")[0] == name)))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
