#!/usr/bin/env python3
"""Independent numpy reference of the Gemma 3 forward pass and its SentencePiece
tokenizer, for the model runtime test (tests/model/test_gemma3_ref.c).

Reads the GGUF through the `gguf` package of the Python package index (its own
parser and dequantisers, not ours; helpers shared with ref_llama.py) and
computes logits in float64 with plain numpy: embedding * sqrt(n_embd), per
layer RMSNorm -> Q/K/V -> RMS norm of each Q and K head -> NEOX RoPE (base 1e6
on global layers, 10000 on sliding-window ones) -> causal attention, masked to
the last `sliding_window` keys on local layers -> output projection ->
post-attention norm + residual -> RMSNorm -> GeGLU (tanh GELU) -> post-FFN
norm + residual; final norm, tied output head, soft-capping when the metadata
asks for it.  Layer l is global when (l + 1) % 6 == 0 unless the metadata lists
the pattern.

The tokenizer is SentencePiece BPE written the plain way (no heap): spaces
become U+2581, user-defined tokens are split out of the text first (longest
first), then the adjacent pair whose concatenation is the best-scoring token is
merged (leftmost on ties) until none is left; characters without a token
become their <0xXX> byte tokens.  bos first when add_bos_token says so.

usage: ref_gemma3.py MODEL logits TOKENS_FILE OUT_FILE NPOS
           tokens: one prompt per line, ids separated by spaces; out: float32
           [prompts][NPOS][vocab], the logits of each prompt's last NPOS tokens
       ref_gemma3.py MODEL tokenize TEXT_FILE OUT_FILE [TEXT_FILE OUT_FILE ...]
           out: one id per line
Exit 77 when numpy or gguf are missing (the test is then skipped).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import gguf
    from ref_llama import field, tensor, rmsnorm
except ImportError as e:  # pragma: no cover
    print(f"ref_gemma3: {e}; run ./ri setup", file=sys.stderr)
    sys.exit(77)

ARCH = "gemma3"


def opt(r, key, default):
    return field(r, key) if key in r.fields else default


def rope_neox(x, pos, theta):
    # x: [n, heads, d]; rotate (i, i + d/2) by pos * theta^(-2i/d)
    d = x.shape[-1]
    half = d // 2
    i = np.arange(half, dtype=np.float64)
    ang = pos[:, None] * theta ** (-2.0 * i / d)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def layer_is_local(r, l, n_layers):
    key = f"{ARCH}.attention.sliding_window_pattern"
    if key in r.fields:
        v = field(r, key)
        if isinstance(v, list):
            return bool(v[l])
        return (l + 1) % int(v) != 0
    return (l + 1) % 6 != 0


def attention(q, k, v, window):
    n, nh, d = q.shape
    nkv = k.shape[1]
    i = np.arange(n)
    keep = (i[None, :] <= i[:, None])
    if window:
        keep &= (i[:, None] - i[None, :]) < window
    mask = np.where(keep, 0.0, -np.inf)
    out = np.zeros((n, nh, d))
    for hq in range(nh):
        hk = hq // (nh // nkv)
        s = q[:, hq, :] @ k[:, hk, :].T / np.sqrt(d) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        out[:, hq, :] = s @ v[:, hk, :]
    return out


def block(r, l, x, hp):
    p = f"blk.{l}."
    W = {k: tensor(r, p + k + ".weight") for k in
         ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
          "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")}
    n, eps, nh, nkv, d = x.shape[0], hp["eps"], hp["nh"], hp["nkv"], hp["d"]
    local = layer_is_local(r, l, hp["L"])
    theta = hp["theta_swa"] if local else hp["theta"]
    pos = np.arange(n, dtype=np.float64)
    h = rmsnorm(x, W["attn_norm"], eps)
    q = rmsnorm((h @ W["attn_q"].T).reshape(n, nh, d), W["attn_q_norm"], eps)
    k = rmsnorm((h @ W["attn_k"].T).reshape(n, nkv, d), W["attn_k_norm"], eps)
    v = (h @ W["attn_v"].T).reshape(n, nkv, d)
    q, k = rope_neox(q, pos, theta), rope_neox(k, pos, theta)
    att = attention(q, k, v, hp["window"] if local else 0)
    x = x + rmsnorm(att.reshape(n, nh * d) @ W["attn_output"].T, W["post_attention_norm"], eps)
    h = rmsnorm(x, W["ffn_norm"], eps)
    f = (gelu_tanh(h @ W["ffn_gate"].T) * (h @ W["ffn_up"].T)) @ W["ffn_down"].T
    return x + rmsnorm(f, W["post_ffw_norm"], eps)


def logits(path, prompts, npos):
    """Logits float32 [prompts][npos][vocab]: each prompt's last npos tokens."""
    r = gguf.GGUFReader(path)
    assert field(r, "general.architecture") == ARCH
    hp = {
        "L": int(field(r, f"{ARCH}.block_count")),
        "nh": int(field(r, f"{ARCH}.attention.head_count")),
        "nkv": int(field(r, f"{ARCH}.attention.head_count_kv")),
        "d": int(field(r, f"{ARCH}.attention.key_length")),
        "eps": float(field(r, f"{ARCH}.attention.layer_norm_rms_epsilon")),
        "theta": float(field(r, f"{ARCH}.rope.freq_base")),
        "theta_swa": float(opt(r, f"{ARCH}.rope.freq_base_swa", 10000.0)),
        "window": int(opt(r, f"{ARCH}.attention.sliding_window", 0)),
    }
    cap = float(opt(r, f"{ARCH}.final_logit_softcapping", 0.0))
    emb = tensor(r, "token_embd.weight")
    xs = [emb[np.array(t)] * np.sqrt(emb.shape[1]) for t in prompts]
    for l in range(hp["L"]):
        xs = [block(r, l, x, hp) for x in xs]
    norm = tensor(r, "output_norm.weight")
    eps = hp["eps"]
    out = []
    for x in xs:
        lg = rmsnorm(x[-npos:], norm, eps) @ emb.T
        if cap > 0:
            lg = cap * np.tanh(lg / cap)
        out.append(lg.astype(np.float32))
    return np.concatenate(out)


class Spm:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.tokens = field(r, "tokenizer.ggml.tokens")
        self.scores = [float(s) for s in field(r, "tokenizer.ggml.scores")]
        types = [int(t) for t in field(r, "tokenizer.ggml.token_type")]
        self.vocab = {}
        for i, t in enumerate(self.tokens):
            self.vocab.setdefault(t, i)
        self.user = sorted((t for t, ty in zip(self.tokens, types) if ty == 4 and t), key=len, reverse=True)
        self.bos = int(field(r, "tokenizer.ggml.bos_token_id"))
        self.add_bos = bool(opt(r, "tokenizer.ggml.add_bos_token", True))

    def fragment(self, text):
        syms = list(text.replace(" ", "\u2581"))
        while True:
            best = None
            for i in range(len(syms) - 1):
                t = self.vocab.get(syms[i] + syms[i + 1])
                if t is not None and (best is None or self.scores[t] > best[0]):
                    best = (self.scores[t], i)
            if best is None:
                break
            i = best[1]
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        ids = []
        for s in syms:
            if s in self.vocab:
                ids.append(self.vocab[s])
            else:
                ids += [self.vocab["<0x%02X>" % b] for b in s.encode()]
        return ids

    def encode(self, text):
        ids = [self.bos] if self.add_bos else []
        frag = ""
        i = 0
        while i < len(text):
            hit = next((u for u in self.user if text.startswith(u, i)), None)
            if hit is None:
                frag += text[i]
                i += 1
                continue
            ids += self.fragment(frag) + [self.vocab[hit]]
            frag = ""
            i += len(hit)
        return ids + self.fragment(frag)


def main():
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    model, mode = sys.argv[1:3]
    if mode == "logits" and len(sys.argv) == 6:
        prompts = [[int(t) for t in line.split()] for line in open(sys.argv[3]) if line.strip()]
        logits(model, prompts, int(sys.argv[5])).tofile(sys.argv[4])
    elif mode == "tokenize" and len(sys.argv) % 2 == 1:
        spm = Spm(model)
        for inp, out in zip(sys.argv[3::2], sys.argv[4::2]):
            ids = spm.encode(open(inp, encoding="utf-8", newline="").read())
            open(out, "w").write("\n".join(map(str, ids)) + "\n")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
