#!/usr/bin/env python3
"""Independent numpy reference of the Llama forward pass, for the model runtime test.

Reads the GGUF through the `gguf` package of the Python package index (its own
parser and dequantisers, not ours) and computes logits in float64 with plain
numpy: embedding, RMSNorm, RoPE on adjacent pairs (GGUF llama layout), GQA
causal attention, SwiGLU, tied output head.  Also a small ASCII-only GPT-2
BPE (digits split one by one, as SmolLM2's pre-tokenizer does) to check our
tokenizer's ids on ASCII prompts.

usage: ref_llama.py MODEL logits TOKENS_FILE OUT_FILE   (tokens: one prompt per line, ids
                                                         separated by spaces; out: float32
                                                         [total tokens][vocab])
       ref_llama.py MODEL tokenize TEXT_FILE OUT_FILE [TEXT_FILE OUT_FILE ...]
                                                        (out: one id per line)
Exit 77 when numpy or gguf are missing (the test is then skipped).
"""
import re
import sys

try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError as e:  # pragma: no cover
    print(f"ref_llama: {e}; run ./ri setup", file=sys.stderr)
    sys.exit(77)


def field(r, key):
    f = r.fields[key]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i][0] for i in f.data]
    return f.parts[f.data[0]][0]


def tensor(r, name):
    for t in r.tensors:
        if t.name == name:
            w = quants.dequantize(t.data, t.tensor_type)
            return np.asarray(w, dtype=np.float64)
    raise KeyError(name)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta, n_rot):
    # x: [n, heads, d]; rotate pairs (2i, 2i+1) by pos * theta^(-2i/n_rot)
    i = np.arange(n_rot // 2, dtype=np.float64)
    ang = pos[:, None] * theta ** (-2.0 * i / n_rot)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * c - x1 * s
    out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


def logits(path, prompts):
    """Logits float32 [n][vocab] of each prompt (a list of id lists), concatenated."""
    r = gguf.GGUFReader(path)
    L = int(field(r, "llama.block_count"))
    nh = int(field(r, "llama.attention.head_count"))
    nkv = int(field(r, "llama.attention.head_count_kv"))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
    theta = float(field(r, "llama.rope.freq_base"))
    emb = tensor(r, "token_embd.weight")
    E = emb.shape[1]
    d = E // nh
    xs = [emb[np.array(t)] for t in prompts]
    for l in range(L):
        p = f"blk.{l}."
        W = {k: tensor(r, p + k + ".weight") for k in
             ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
        for j, x in enumerate(xs):
            n = x.shape[0]
            pos = np.arange(n, dtype=np.float64)
            mask = np.triu(np.full((n, n), -np.inf), 1)
            h = rmsnorm(x, W["attn_norm"], eps)
            q = (h @ W["attn_q"].T).reshape(n, nh, d)
            k = (h @ W["attn_k"].T).reshape(n, nkv, d)
            v = (h @ W["attn_v"].T).reshape(n, nkv, d)
            q, k = rope(q, pos, theta, d), rope(k, pos, theta, d)
            att = np.zeros((n, nh, d))
            for hq in range(nh):
                hk = hq // (nh // nkv)
                s = q[:, hq, :] @ k[:, hk, :].T / np.sqrt(d) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, hq, :] = s @ v[:, hk, :]
            x = x + att.reshape(n, E) @ W["attn_output"].T
            h = rmsnorm(x, W["ffn_norm"], eps)
            g = h @ W["ffn_gate"].T
            u = h @ W["ffn_up"].T
            xs[j] = x + (g / (1 + np.exp(-g)) * u) @ W["ffn_down"].T
    names = {t.name for t in r.tensors}
    out = tensor(r, "output.weight") if "output.weight" in names else emb
    norm = tensor(r, "output_norm.weight")
    return np.concatenate([(rmsnorm(x, norm, eps) @ out.T).astype(np.float32) for x in xs])


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenize(path, text):
    r = gguf.GGUFReader(path)
    vocab = {t: i for i, t in enumerate(field(r, "tokenizer.ggml.tokens"))}
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(field(r, "tokenizer.ggml.merges"))}
    b2u = bytes_to_unicode()
    pat = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
    ids = []
    for seg in re.split(r"([0-9])", text):   # Digits(individual_digits=True), isolated
        for word in pat.findall(seg):
            syms = [b2u[b] for b in word.encode()]
            while len(syms) > 1:
                pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(syms, syms[1:]))]
                rank, i = min(pairs)
                if rank == 1 << 30:
                    break
                syms[i:i + 2] = [syms[i] + syms[i + 1]]
            ids += [vocab[s] for s in syms]
    return ids


def main():
    if len(sys.argv) < 5 or len(sys.argv) % 2 == 0:
        print(__doc__, file=sys.stderr)
        return 2
    model, mode, inp, out = sys.argv[1:5]
    if mode == "logits":
        prompts = [[int(t) for t in line.split()] for line in open(inp) if line.strip()]
        logits(model, prompts).tofile(out)
    elif mode == "tokenize":
        for inp, out in zip(sys.argv[3::2], sys.argv[4::2]):
            ids = tokenize(model, open(inp, encoding="utf-8").read())
            open(out, "w").write("\n".join(map(str, ids)) + "\n")
    else:
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
