#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# admin_spdx: scripts/spdx.sh on a scratch repository: headers in each file type's comment
# syntax (after a #! line), data and docs untouched, modes kept, a second run changes
# nothing, --check fails before and passes after.
# usage: spdx_selftest.sh PATH/TO/spdx.sh
set -u
spdx=$1
fails=0
fail() { echo "FAIL admin_spdx: $*"; fails=$((fails + 1)); }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/spdx-selftest.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" && git init -q . || exit 2
mkdir -p src tests/fuzz/corpus
printf 'int x;\n' >src/a.cpp
printf '/* C header */\n#pragma once\n' >src/b.h
printf '#!/bin/sh\necho hi\n' >run.sh && chmod 755 run.sh
printf '#!/usr/bin/env python3\nprint(1)\n' >tool && chmod 755 tool
printf 'import os\n' >lib.py
printf '{ global: x; local: *; };\n' >exports.map
printf 'project(x)\n' >CMakeLists.txt
printf '# Title\n' >README.md
printf '\001\002\003' >tests/fuzz/corpus/seed.bin
printf '// SPDX-License-Identifier: MIT\nint y;\n' >src/other.cpp
printf 'data\n' >notes.xyz
git add -A

out=$(bash "$spdx" --check 2>&1) && fail "--check passed on files without headers"
echo "$out" | grep -q "missing: src/a.cpp" || fail "--check did not list src/a.cpp: $out"
bash "$spdx" >/dev/null 2>&1 || fail "the first run failed"

expect() {  # expect FILE LINE_NO TEXT
  got=$(sed -n "$2p" "$1")
  [ "$got" = "$3" ] || fail "$1 line $2 is '$got', expected '$3'"
}
expect src/a.cpp 1 "// SPDX-License-Identifier: Apache-2.0"
expect src/a.cpp 2 "int x;"
expect src/b.h 1 "// SPDX-License-Identifier: Apache-2.0"
expect run.sh 1 "#!/bin/sh"
expect run.sh 2 "# SPDX-License-Identifier: Apache-2.0"
expect tool 2 "# SPDX-License-Identifier: Apache-2.0"
expect lib.py 1 "# SPDX-License-Identifier: Apache-2.0"
expect exports.map 1 "/* SPDX-License-Identifier: Apache-2.0 */"
expect CMakeLists.txt 1 "# SPDX-License-Identifier: Apache-2.0"
expect README.md 1 "# Title"
expect src/other.cpp 1 "// SPDX-License-Identifier: MIT"
expect notes.xyz 1 "data"
[ "$(od -An -tx1 tests/fuzz/corpus/seed.bin | tr -d ' ')" = "010203" ] || fail "the corpus file changed"
[ -x run.sh ] && [ -x tool ] || fail "executable bits lost"

before=$(cat src/* run.sh tool lib.py exports.map CMakeLists.txt | cksum)
second=$(bash "$spdx" 2>&1)
echo "$second" | grep -q "added the header to 0 file(s)" || fail "second run changed files: $second"
[ "$(cat src/* run.sh tool lib.py exports.map CMakeLists.txt | cksum)" = "$before" ] || fail "second run changed content"
bash "$spdx" --check >/dev/null 2>&1 || fail "--check failed after the run"
[ "$fails" -eq 0 ] && echo "PASS admin_spdx"
[ "$fails" -eq 0 ]
