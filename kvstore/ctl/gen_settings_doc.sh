#!/usr/bin/env bash
# Print the settings table of docs/kvstore.md from `ri-kvstore --help`, so the
# documentation is generated from the one config table in kvs_ctl.c.
#   kvstore/ctl/gen_settings_doc.sh BUILD/bin/ri-kvstore           print the table
#   kvstore/ctl/gen_settings_doc.sh BUILD/bin/ri-kvstore DOC.md    exit 1 if DOC.md's table differs
set -euo pipefail
bin="${1:?usage: gen_settings_doc.sh PATH/TO/ri-kvstore [DOC.md]}"
table() {
  echo "| setting | environment | type | default | meaning |"
  echo "|---|---|---|---|---|"
  "$bin" --help | awk '/^  --/ {
    name = $1; sub(/^--/, "", name); type = $2
    line = $0; sub(/^  --[^ ]+ +[^ ]+ +/, "", line)
    def = line; sub(/.*\(default: /, "", def); sub(/\)$/, "", def)
    help = line; sub(/ \(default: [^(]*\)$/, "", help); gsub(/\|/, "\\|", help)
    env = "RI_KVS_" toupper(name); gsub(/-/, "_", env)
    if (def == "") def = "(empty)"
    printf "| `--%s` | `%s` | %s | `%s` | %s |\n", name, env, type, def, help }'
}
if [ $# -lt 2 ]; then
  table
  exit 0
fi
doc="$2"
want="$(table)"
have="$(sed -n '/<!-- settings:begin -->/,/<!-- settings:end -->/p' "$doc" | sed '1d;$d')"
if [ "$want" != "$have" ]; then
  echo "docs out of date: the settings table in $doc differs from ri-kvstore --help; regenerate with:" >&2
  echo "  $0 $bin > table.md   (and paste it between the settings markers)" >&2
  diff <(echo "$want") <(echo "$have") >&2 || true
  exit 1
fi
echo "settings table of $doc matches ri-kvstore --help"
