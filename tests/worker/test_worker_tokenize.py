#!/usr/bin/env python3
"""ri-worker's POST /tokenize and POST /detokenize (docs/worker.md), against
the real process and model, behind API keys:
  - without a key both answer 401; with one, 200;
  - /tokenize with add_special counts exactly the prompt tokens that a
    completion of the same text reports in usage.prompt_tokens (what a
    benchmark needs to size its prompts), and without it the text alone;
  - special token texts stay plain text ("<|im_start|>" is several ids),
    and become their one id with parse_special;
  - /detokenize gives the text back (round trip);
  - bad input (content not a string, ids out of range or not integers, a
    body that is not JSON, GET) gets 400/405 with OpenAI's error body, and
    the worker still answers afterwards;
  - /metrics counts the requests under their endpoints.
Only the standard library.  Exits 77 (skipped) without the model or binary.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_worker_http as wh  # noqa: E402  Worker, check(), paths
from test_worker_http_sec import keyed, write_keys  # noqa: E402

check = wh.check
TEXT = "The grass is green. Héllo, wörld! One of the special magic numbers for bright-apple is: 4216358."


def run(tmp):
    key = "kt-" + os.urandom(16).hex()
    keys = os.path.join(tmp, "api-keys")
    write_keys(keys, key)
    w = wh.Worker("--api-keys-file", keys, tmp=tmp)
    try:
        for path, body in (("/tokenize", {"content": "x"}), ("/detokenize", {"tokens": [1]})):
            st, _, c = keyed(w, "POST", path, body=body)
            check(st == 401 and c["error"]["code"] == "invalid_api_key", "%s without a key -> 401 (%s)" % (path, c))

        st, _, plain = keyed(w, "POST", "/tokenize", body={"content": TEXT}, key=key)
        check(st == 200 and isinstance(plain.get("tokens"), list) and len(plain["tokens"]) > 10 and
              all(isinstance(t, int) for t in plain["tokens"]), "/tokenize -> 200 {tokens: [ids]} (%s)" % plain)
        st, _, withbos = keyed(w, "POST", "/tokenize", body={"content": TEXT, "add_special": True}, key=key)
        st2, _, comp = keyed(w, "POST", "/v1/completions", body=
                             {"model": wh.MODEL_ID, "prompt": TEXT, "max_tokens": 1, "temperature": 0,
                              "attn": "full"}, key=key)
        check(st == 200 and st2 == 200 and len(withbos["tokens"]) == comp["usage"]["prompt_tokens"],
              "add_special: as many tokens as the completion's prompt_tokens (%d, %s)" %
              (len(withbos.get("tokens", [])), comp.get("usage")))
        check(withbos["tokens"][-len(plain["tokens"]):] == plain["tokens"] and
              len(withbos["tokens"]) - len(plain["tokens"]) in (0, 1), "add_special adds at most a bos in front")
        st, _, sp = keyed(w, "POST", "/tokenize", body={"content": "<|im_start|>"}, key=key)
        check(st == 200 and len(sp["tokens"]) > 1, "a special token's text stays plain text (%s)" % sp)
        st, _, sp1 = keyed(w, "POST", "/tokenize", body={"content": "<|im_start|>user", "parse_special": True},
                           key=key)
        st2, _, user = keyed(w, "POST", "/tokenize", body={"content": "user"}, key=key)
        check(st == 200 and len(sp1["tokens"]) == 1 + len(user["tokens"]) and sp1["tokens"][1:] == user["tokens"],
              "parse_special: a special token's text is its one id (%s)" % sp1)

        st, _, back = keyed(w, "POST", "/detokenize", body={"tokens": plain["tokens"]}, key=key)
        check(st == 200 and back == {"content": TEXT}, "/detokenize gives the text back (%s)" % back)
        st, _, back = keyed(w, "POST", "/detokenize", body={"tokens": []}, key=key)
        check(st == 200 and back == {"content": ""}, "/detokenize of no ids -> empty text")

        bad = [("/tokenize", {"content": 5}, "content"), ("/tokenize", {"text": "x"}, "content"),
               ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
               ("/tokenize", {"content": "x", "parse_special": 1}, "parse_special"),
               ("/detokenize", {"tokens": [10 ** 9]}, "tokens"), ("/detokenize", {"tokens": [1.5]}, "tokens"),
               ("/detokenize", {"tokens": "1 2"}, "tokens"), ("/detokenize", [1, 2], None)]
        for path, body, param in bad:
            st, _, c = keyed(w, "POST", path, key=key, body=body)
            check(st == 400 and c["error"]["type"] == "invalid_request_error" and c["error"]["param"] == param,
                  "%s %s -> 400 naming %s (%s)" % (path, body, param, c["error"]["message"]))
        st, _, c = keyed(w, "GET", "/tokenize", key=key)
        check(st == 405 and c["error"]["code"] == "method_not_allowed", "GET /tokenize -> 405")
        st, _, c = keyed(w, "POST", "/tokenize", body={"content": "still here"}, key=key)
        check(st == 200 and c["tokens"], "the worker still answers after bad input")

        st, _, text = keyed(w, "GET", "/metrics", key=key)
        check('ri_worker_requests_total{endpoint="/tokenize",code="200"} 6' in text and
              'ri_worker_requests_total{endpoint="/detokenize",code="400"} 4' in text and
              'ri_worker_requests_total{endpoint="/tokenize",code="401"} 1' in text and
              'ri_worker_requests_total{endpoint="/tokenize",code="400"} 4' in text,
              "/metrics counts /tokenize and /detokenize by code")
    finally:
        rc = w.stop()
    check(rc == 0, "SIGTERM -> exit 0 (%s)" % rc)


def main():
    if not os.path.exists(wh.MODEL):
        print("skip: no model at %s" % wh.MODEL)
        return 77
    if not os.access(wh.WORKER, os.X_OK):
        print("skip: ri-worker not built in %s" % wh.BUILD)
        return 77
    with tempfile.TemporaryDirectory(prefix="ri-tok-") as tmp:
        try:
            run(tmp)
        except Exception as e:
            check(False, "%s: %s" % (type(e).__name__, e))
    if wh.failures:
        print("%d check(s) failed" % len(wh.failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
