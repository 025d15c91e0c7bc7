#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The drop-in libibverbs.so.1 must define every IBVERBS_* symbol, at the version node it is
# referenced at, that the rdma-core consumers installed here reference: ibv_devinfo,
# ibv_rc_pingpong, perftest's ib_write_bw/ib_write_lat, librdmacm, and the providers
# perftest links (libmlx5, libefa). A consumer referencing a missing version node is
# refused by the loader; a missing symbol fails when it is bound.
#
#   check_dropin_exports.sh PATH/TO/libibverbs.so.1
set -uo pipefail
lib=$1
have=$(objdump -T "$lib" | awk '$2 != "" && !/\*UND\*/ && /IBVERBS/ { print $NF "@" $(NF-1) }' | tr -d '()' | sort -u)
[ -n "$have" ] || { echo "FAIL: $lib exports no IBVERBS_* symbol"; exit 1; }
consumers=()
for f in /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ib_write_bw /usr/bin/ib_write_lat; do
  [ -x "$f" ] && consumers+=("$f")
done
for name in librdmacm.so.1 libmlx5.so.1 libefa.so.1; do
  f=$(ldconfig -p | awk -v n="$name" '$1 == n { print $NF; exit }')
  [ -n "$f" ] && consumers+=("$f")
done
[ ${#consumers[@]} -ge 3 ] || { echo "FAIL: rdma-core's tools/perftest are not installed (scripts/setup.sh)"; exit 1; }
status=0
for f in "${consumers[@]}"; do
  need=$(objdump -T "$f" | awk '/\*UND\*/ && /IBVERBS/ { print $NF "@" $(NF-1) }' | tr -d '()' | sort -u)
  missing=$(comm -23 <(echo "$need") <(echo "$have"))
  if [ -n "$missing" ]; then
    echo "FAIL: $f needs what the drop-in lacks: $(echo "$missing" | xargs)"
    status=1
  else
    echo "ok: $f: $(echo "$need" | wc -l) symbols, all defined at their versions"
  fi
done
exit $status
