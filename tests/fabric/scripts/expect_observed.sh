#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs CMD (verbs_check on 2 nodes, under vmesh or fabric-net) and checks every
# "OBSERVED <case> ..." line it prints against the BACKEND column (rxe or meshfab) of
# tests/fabric/verbs_semantics.txt. Fails when a case is missing, differs, or CMD fails.
#
#   expect_observed.sh rxe|meshfab -- CMD...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
table=$here/../verbs_semantics.txt
backend=$1
[ "${2:-}" = "--" ] || { echo "usage: $0 rxe|meshfab -- CMD..." >&2; exit 64; }
shift 2
case $backend in rxe) col=2 ;; meshfab) col=3 ;; *) echo "unknown backend $backend" >&2; exit 64 ;; esac
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
status=0
# Columns are separated by " | " (space, bar, space), so a column's regex may use | itself.
while IFS=$'\t' read -r name rxe fab; do
  name=$(echo "$name" | sed 's/^ *//; s/ *$//')
  [ -z "$name" ] || [ "${name#\#}" != "$name" ] && continue
  want=$( [ $col = 2 ] && echo "$rxe" || echo "$fab")
  want=$(echo "$want" | sed 's/^ *//; s/ *$//')
  line=$(grep -aoE "OBSERVED $name .*" "$out" | head -n 1 | sed "s/^OBSERVED $name //; s/ *\$//")
  if [ -z "$line" ]; then
    echo "MISMATCH $name: no OBSERVED line"
    status=1
  elif [[ ! $line =~ ^$want$ ]]; then
    echo "MISMATCH $name on $backend:"
    echo "   observed: $line"
    echo "   expected: $want"
    status=1
  else
    echo "as expected on $backend: $name: $line"
  fi
done < <(sed 's/ | /\t/g' "$table")
[ "$rc" -eq 0 ] || { echo "MISMATCH: the command exited $rc"; status=1; }
[ $status -eq 0 ] && echo "EXPECTED: every case behaves as verbs_semantics.txt says for $backend"
exit $status
