#!/usr/bin/env bash
# ri bench passkey with the real model: two 2K-token prompts (random keys at
# depth 0.5), each prefilled once and answered by full, in-process
# retroinfer and retroinfer-remote through a ri-kvstore the bench starts,
# at two retrieval floors (0 and 256 tokens).  Checks the JSON: a row per
# variant, full finds both keys, the floor of 256 makes both retroinfer
# engines attend more tokens exactly than the bare share (so the setting
# reaches the in-process wave and the kvstore session alike), and quest
# follows the floor.  Skips (77) without the installed model.
set -euo pipefail
bin="${RI_BUILD_DIR:?}/bin"
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
[ -x "$bin/ri-bench-passkey" ] || { echo "skip: ri-bench-passkey not built"; exit 77; }
work="$(mktemp -d "${TMPDIR:-/tmp}/ri-pk-XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$bin/ri-bench-passkey" --contexts 2048 --depths 0.5 --trials 2 \
  --methods full,retroinfer,retroinfer-remote,quest --retrieval-min 0,256 --json "$work/pk.json" | tail -n 12

python3 - "$work/pk.json" <<'PY'
import json, sys
rows = {r["variant"]: r for r in json.load(open(sys.argv[1]))["rows"]}
want = ["full", "retroinfer min=0", "retroinfer min=256", "retroinfer-remote min=0",
        "retroinfer-remote min=256", "quest min=0", "quest min=256"]
missing = [w for w in want if w not in rows]
assert not missing, f"no rows for {missing}"
assert rows["full"]["passed"] == 2, f"full attention missed a key: {rows['full']}"
ex = {k: r["exact_tokens_per_head"] for k, r in rows.items()}
for eng in ("retroinfer", "retroinfer-remote", "quest"):
    lo, hi = ex[f"{eng} min=0"], ex[f"{eng} min=256"]
    # 2K: the share retrieves ~2 clusters (32 tokens), the floor 16 (256)
    assert hi >= lo + 150, f"{eng}: the floor did not raise the exact tokens ({lo:.0f} -> {hi:.0f})"
assert abs(ex["retroinfer min=256"] - ex["retroinfer-remote min=256"]) < 8, ex
print("ok:", {k: round(v) for k, v in ex.items()})
PY
