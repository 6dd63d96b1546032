#!/usr/bin/env bash
# The repository must stand on its own: no file may point a reader at design
# notes that are not in it (the team's planning folder, its DESIGN/BENCH/STYLE
# pages) or at a tracker that is not in it (an issue, task or ticket by its
# number, a bare "#N", "the issue's" targets): the text says what it means
# instead.  A public project's issue ("grpc/grpc#N") is fine.  Run as a
# test (tests/common/test_external_refs_catches.sh tests this check); prints
# every offending line and fails.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
pat='(DESIGN|BENCH|STYLE)\.md|\.\./shared/|shared/(DESIGN|BENCH|STYLE)'
pat="$pat"'|[Ii]ssues? (rows? )?#?[0-9]+|[Ii]ssue rows?|[Tt]asks? #?[0-9]+|[Tt]ickets? #?[0-9]+|[Tt]he issue('"'"'s| asks)'
pat="$pat"'|(^|[ (,])#[0-9]+[,);]'
if git ls-files >/dev/null 2>&1; then
  files=$(git ls-files | grep -v '^tools/check_no_external_refs.sh$' || true)
else
  files=$(find . -type f -not -path './build*' -not -path './.git/*' -not -name check_no_external_refs.sh)
fi
# shellcheck disable=SC2086
hits=$(printf '%s\n' $files | xargs -r grep -nE "$pat" 2>/dev/null || true)
if [ -n "$hits" ]; then
  echo "files cite design notes that are not in the repository:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "no external design references"
