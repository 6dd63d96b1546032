"""HTTP checks of test_compose.sh against the stack's front door and the
kvstore's /metrics (standard library only).

  compose_client.py models URL          the one model is listed
  compose_client.py complete URL N      N greedy completions; all the same text, printed
  compose_client.py remote URL          a ~1.3K-token prompt on retroinfer-remote
  compose_client.py metric URL NAME     a Prometheus metric of URL, summed over its labels

The workers' API key comes from RI_API_KEY.
"""
import json
import os
import sys
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
    elif cmd == "metric":
        name = sys.argv[3]
        text = call(base).decode()
        print(int(sum(float(line.split()[-1]) for line in text.splitlines()
                      if line.split("{")[0].split(" ")[0] == name)))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
