#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# spdx.sh: puts "SPDX-License-Identifier: Apache-2.0" at the top of every tracked source
# file that lacks it, in that file type's comment syntax (after a #! line if there is one).
# Idempotent: a file that names an SPDX identifier in its first 5 lines is left alone.
# Skipped: documentation (*.md), LICENSE, fuzzer corpora and other data (tests/fuzz/corpus/,
# binary files), files of unknown type (listed).
#
#   scripts/spdx.sh [--check] [PATH...]
#     PATHs (files or directories) limit it to those tracked files; default: the whole
#     repository. --check changes nothing: it lists the files missing the header and exits 1
#     if there are any (for a test once every file has one).
set -euo pipefail

ID="SPDX-License-Identifier: Apache-2.0"
check=0
paths=()
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "spdx.sh: unknown option '$arg'" >&2; exit 64 ;;
    *) paths+=("$arg") ;;
  esac
done

# The comment line for a file, or nothing when the file is skipped.
header_for() {
  local f=$1
  case "$f" in
    *.md|LICENSE|*/LICENSE|*/corpus/*|corpus/*) return ;;
    *.c|*.cc|*.cpp|*.h|*.hpp) echo "// $ID" ;;
    *.map) echo "/* $ID */" ;;
    *.sh|*.py|*.cmake|*CMakeLists.txt|*.gitignore|*.yml|*.yaml) echo "# $ID" ;;
    *) if head -c 2 "$f" | grep -q '^#!'; then echo "# $ID"; fi ;;
  esac
}

has_id() { head -n 5 "$1" | grep -q 'SPDX-License-Identifier:'; }

# Inserts $2 as line 1, or as line 2 after a #! line.
add_header() {
  local f=$1 line=$2 tmp
  tmp=$(mktemp "$f.spdx.XXXXXX")
  if head -c 2 "$f" | grep -q '^#!'; then
    { head -n 1 "$f"; echo "$line"; tail -n +2 "$f"; } >"$tmp"
  else
    { echo "$line"; cat "$f"; } >"$tmp"
  fi
  chmod --reference="$f" "$tmp"
  mv "$tmp" "$f"
}

cd "$(git rev-parse --show-toplevel)"
missing=0 added=0 skipped=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  grep -Iq . "$f" || { skipped+=("$f (binary or empty)"); continue; }
  line=$(header_for "$f")
  if [ -z "$line" ]; then
    case "$f" in *.md|LICENSE|*/LICENSE|*/corpus/*) ;; *) skipped+=("$f (unknown type)") ;; esac
    continue
  fi
  has_id "$f" && continue
  if [ "$check" -eq 1 ]; then
    echo "missing: $f"
    missing=$((missing + 1))
  else
    add_header "$f" "$line"
    echo "added: $f"
    added=$((added + 1))
  fi
done < <(git ls-files -z -- "${paths[@]}")

for s in "${skipped[@]+"${skipped[@]}"}"; do echo "skipped: $s"; done
if [ "$check" -eq 1 ]; then
  echo "spdx.sh: $missing file(s) without an SPDX header"
  [ "$missing" -eq 0 ]
else
  echo "spdx.sh: added the header to $added file(s)"
fi
