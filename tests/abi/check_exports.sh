#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# abi_exports: the plugin's whole dynamic interface is the five tables NCCL looks up
# (ncclNetPlugin_v8, _v9, _v10, _v11, _v12), and
# it has no link-time dependency on rdma-core (libibverbs is dlopen'ed at init).
#
#   check_exports.sh LIBRARY [NM] [READELF]
#
# Exit status: 0 every check passed, 1 a check failed, 2 usage or tool error.
set -u

# Sorted as `sort` prints them.
expected="ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v12 ncclNetPlugin_v8 ncclNetPlugin_v9"
expected_count=5
lib=${1:-}
nm=${2:-nm}
readelf=${3:-readelf}

if [ -z "$lib" ] || [ ! -f "$lib" ]; then
  echo "usage: $0 LIBRARY [NM] [READELF] (library '$lib' not found)" >&2
  exit 2
fi

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# 1. Defined dynamic symbols: exactly the $expected_count tables in $expected.
#    Lines look like "00000000000218c0 D ncclNetPlugin_v8" (possibly "@VERSION" after it).
if ! defined=$("$nm" -D --defined-only "$lib"); then
  echo "ERROR: $nm -D --defined-only $lib failed" >&2
  exit 2
fi
count=$(printf '%s\n' "$defined" | grep -c .)
if [ "$count" -ne "$expected_count" ]; then
  fail "$count defined dynamic symbols, expected exactly $expected_count ($expected):"
  printf '%s\n' "$defined" | sed 's/^/  /'
else
  names=$(printf '%s\n' "$defined" | awk '{ n = $NF; sub(/@.*/, "", n); print n }' | LC_ALL=C sort | tr '\n' ' ')
  if [ "${names% }" != "$expected" ]; then
    fail "the defined dynamic symbols are '${names% }', expected '$expected'"
  fi
fi

# 2. No undefined reference to verbs: every ibv_* call goes through the dlopen'ed table.
if ! undefined=$("$nm" -D --undefined-only "$lib"); then
  echo "ERROR: $nm -D --undefined-only $lib failed" >&2
  exit 2
fi
verbs_refs=$(printf '%s\n' "$undefined" | grep -E '(^|[[:space:]])_*ibv_' || true)
if [ -n "$verbs_refs" ]; then
  fail "undefined verbs symbols (the plugin must not link libibverbs):"
  printf '%s\n' "$verbs_refs" | sed 's/^/  /'
fi

# 3. No NEEDED entry for rdma-core's libraries.
if ! dynamic=$("$readelf" -d "$lib"); then
  echo "ERROR: $readelf -d $lib failed" >&2
  exit 2
fi
needed=$(printf '%s\n' "$dynamic" | grep '(NEEDED)' | grep -E 'lib(ibverbs|rdmacm|mlx[45])' || true)
if [ -n "$needed" ]; then
  fail "NEEDED entries for rdma-core libraries (they must be dlopen'ed, not linked):"
  printf '%s\n' "$needed" | sed 's/^/  /'
fi

if [ "$failures" -ne 0 ]; then
  echo "abi_exports: $failures check(s) failed for $lib"
  exit 1
fi
echo "abi_exports: OK: $lib defines only $expected, no ibv_* references, no NEEDED libibverbs"
exit 0
