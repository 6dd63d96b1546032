#!/bin/bash
# Every program refuses a malformed command line with exit 2 and a message
# that names the offending word, before it touches anything: a boolean flag
# followed by a boolean word, a stray word among the flags, more positional
# arguments than the program takes, an unknown flag.  A program that
# silently guessed (e.g. "--chat false" read as chat on) fails here.
set -u
bin="${RI_BUILD_DIR:?}/bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect WORD PROGRAM ARGS...: exit status 2 and WORD in the message.
expect() {
  local word="$1" prog="$2"
  shift 2
  [ -x "$bin/$prog" ] || { echo "FAIL: $bin/$prog not built"; fails=$((fails + 1)); return; }
  (cd "$tmp" && "$bin/$prog" "$@") > "$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$word" "$tmp/out"; then
    echo "FAIL: $prog $* -> exit $rc, wanted 2 naming '$word':"
    sed 's/^/    /' "$tmp/out"
    fails=$((fails + 1))
  else
    echo "ok: $prog $* -> $(head -n1 "$tmp/out")"
  fi
}

expect "--chat=false" ri-generate --prompt X --chat false --max-tokens 8
expect "'false'" ri-generate --prompt X --chat=true false --max-tokens 8
expect "'b'" ri-generate a b
expect "--frobnicate" ri-generate --frobnicate=1 --prompt X
expect "'stray'" ri-worker stray
expect "--insecure-admin=" ri-kvstore --insecure-admin yes
expect "'x'" ri-kvstore x
expect "--frobnicate" ri-kvstore --frobnicate
expect "stray" ri-ctl status stray
expect "'--bogus'" ri-ctl --bogus status
expect "--addr" ri-ctl status --addr

# The benches take their options from cm_config tables too: an unknown flag
# or a bad value is refused, and --help lists every option they had (the
# names scripts and docs use; a rename would break them).
expect "--bogus" ri-bench-spill --bogus
expect "'mib'" ri-bench-spill --mib 8
expect "--bogus" ri-bench-kernels --bogus
expect "'rounds'" ri-bench-kernels --rounds 999
expect "--bogus" ri-bench-dataplane --bogus
expect "--bogus" ri-bench-attn-accuracy --bogus
expect "'adapt-tau'" ri-bench-attn-accuracy --adapt-tau 2
expect "--bogus" ri-bench-serve --bogus
expect "'requests'" ri-bench-serve --requests 0
expect "--bogus" ri-bench-load --bogus
expect "--bogus" ri-bench-load --worker --bogus
expect "--worker-arg" ri-bench-load --worker --worker-arg
expect "--bogus" ri-bench-e2e --bogus
expect "'hog'" ri-bench-e2e --hog 65
expect "kvstore-memory" ri-bench-e2e --kvstore-memory lots
expect "--bogus" ri-bench-model --bogus
expect "'steps'" ri-bench-model --steps 999
expect "--bogus" ri-bench-passkey --bogus
expect "'trials'" ri-bench-passkey --trials 0
expect "--depths" ri-bench-passkey --depths 0.1,x
expect "--bogus" ri-bench-ruler --bogus
expect "'trials'" ri-bench-ruler --trials -1
expect "--adapt-tau" ri-bench-ruler --adapt-tau 1
expect "--contexts" ri-bench-ruler --contexts 4K,x
expect "'nope'" ri-bench-ruler --tasks niah_single,nope
expect "--quick" ri-bench-ruler --quick false
# lists PROGRAM [ARGS] -- OPTION...: PROGRAM ARGS --help exits 0 naming each.
lists() {
  local prog="$1" args=()
  shift
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  [ -x "$bin/$prog" ] || { echo "note: $prog not built"; return; }
  (cd "$tmp" && "$bin/$prog" "${args[@]}" --help) > "$tmp/out" 2>&1 || { echo "FAIL: $prog --help failed"; fails=$((fails + 1)); return; }
  for o in "$@"; do
    grep -qE -- "^  --$o " "$tmp/out" || { echo "FAIL: $prog ${args[*]} --help lacks --$o"; fails=$((fails + 1)); }
  done
  echo "ok: $prog ${args[*]} --help lists $*"
}
lists ri-bench-spill -- json dir mib reps qd segment-mib no-fio
lists ri-bench-kernels -- json quick max-n only steps rounds fast-build-from
lists ri-bench-dataplane -- json iters transport clients
lists ri-bench-cuda -- json only max-n steps rounds wave-n
lists ri-bench-attn-accuracy -- json kv layers retrieval-frac retrieval-min adapt-tau cluster-tokens
lists ri-bench-serve -- json clients attn requests max-tokens prompt-words seconds max-batch hog worker model
lists ri-bench-load -- json clients sessions seconds kill-ms worker
lists ri-bench-e2e -- json quick synthetic contexts batches steps hog deadline-us kvstore kvstore-memory model cluster-tokens
lists ri-bench-model -- json contexts steps methods model cluster-tokens
lists ri-bench-passkey -- json contexts depths trials seed methods retrieval-min adapt-tau kvstore model
lists ri-bench-ruler -- json model contexts tasks trials methods seed retrieval-min window adapt-tau trial \
  cluster-tokens estimation quick quiet show-prompt
lists ri-bench-load --worker -- json quick seconds clients slowloris kill-ms max-tokens trickle-ms slowloris-from \
  api-key worker-arg
rm -f "$tmp/out"

# A request ri-worker cannot serve is answered {"ok": false} and makes the
# exit status non-zero (it was 0: a script could not tell).  Needs the model.
if [ -x "$bin/ri-worker" ]; then
  (cd "$tmp" && printf '{"id": 1}\nnot json\n' | "$bin/ri-worker" --attn=full) > "$tmp/out" 2>&1
  rc=$?
  if grep -q '"ok":false' "$tmp/out"; then
    if [ "$rc" -ne 1 ] || ! grep -q "2 request(s) failed" "$tmp/out"; then
      echo "FAIL: ri-worker with 2 failed requests -> exit $rc, wanted 1 and a count:"; sed 's/^/    /' "$tmp/out"
      fails=$((fails + 1))
    else
      echo "ok: ri-worker failed requests -> exit 1"
    fi
  else
    echo "note: ri-worker did not serve (no model?), its exit status is not checked: $(tail -n1 "$tmp/out")"
  fi
  rm -f "$tmp/out"
fi

# Nothing was created by the refused runs (no port file, no spill dir).
if [ -n "$(ls -A "$tmp" | grep -v '^out$')" ]; then
  echo "FAIL: a refused command line left files behind: $(ls -A "$tmp")"
  fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] || { echo "$fails command lines were not refused as they should be"; exit 1; }
echo "all malformed command lines refused"
