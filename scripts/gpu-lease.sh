#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-lease.sh: one lent GPU machine's whole job, as one command (issue 33).
#
# Runs scripts/nccl-e2e.sh with the arguments given (they name the build tree, the order of
# the scenarios, --deadline ...), results in /tmp/nccl-e2e, and keeps a copy of them packed
# under $OUT, the folder whose files come back from the machine: at most 8 files of at most
# 16 MiB each. Packed every 20 s while it runs, so a run stopped at its limit still brings
# back what it had:
#   $OUT/console.log      what nccl-e2e.sh printed
#   $OUT/results.tgz      logs, JSON rows, tables, summary (no traces)
#   $OUT/traces.tgz.aa .. the recorded traces, one tarball cut into 15 MiB parts (at most 5)
#   $OUT/machine.txt      the machine: GPU, driver, kernel, PyTorch and its NCCL
#
#   OUT=DIR scripts/gpu-lease.sh [--mps] [nccl-e2e.sh arguments: --build DIR --only S1,S2
#                                  --deadline SECS --cap SECS --max-bytes SIZE ...]
#
# --mps: start CUDA's MPS daemon first (and stop it at the end), so the ranks' kernels share
# the one GPU at once instead of taking turns in time slices: without it every figure from
# 2 MiB to 8 MiB took one ~4.5 ms slice (2 ranks) whatever the size (first GPU session), so
# busbw measured the GPU's time slicing, not the network. Not yet tried on the GPU machine.
# Exit status: nccl-e2e.sh's.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case "${1:-}" in
  -h|--help)
    sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo
    echo "nccl-e2e.sh's options:"
    "$REPO/scripts/nccl-e2e.sh" --help
    exit 0 ;;
esac
: "${OUT:?OUT names the folder that comes back}"
RES=/tmp/nccl-e2e
MPS=0
if [ "${1:-}" = "--mps" ]; then MPS=1; shift; fi
rm -rf "$RES"
mkdir -p "$RES" "$OUT"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  uname -r
  nproc
  python3 -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
  python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__))' 2>&1
  ldd "$REPO"/build*/libnccl-net-mesh.so 2>&1 | head -20
} >"$OUT/machine.txt" 2>&1

if [ "$MPS" -eq 1 ]; then
  if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/nccl-e2e-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nccl-e2e-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      echo "MPS: started (pipes in $CUDA_MPS_PIPE_DIRECTORY)" >>"$OUT/machine.txt"
      trap 'echo quit | nvidia-cuda-mps-control' EXIT
      # Two processes at once must get the GPU through it; if not, the scenarios run without.
      probe='import torch; x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize(); print(int(x.sum().item()))'
      (timeout 60 python3 -c "$probe" >/tmp/mps-probe.1 2>&1) &
      timeout 60 python3 -c "$probe" >/tmp/mps-probe.2 2>&1
      wait
      p1=$(tail -1 /tmp/mps-probe.1) p2=$(tail -1 /tmp/mps-probe.2)
      if [ "$p1" = 1048576 ] && [ "$p2" = 1048576 ]; then
        echo "MPS: a CUDA process runs through it" >>"$OUT/machine.txt"
      else
        echo "MPS: a CUDA process failed through it ($p1 / $p2); running without" >>"$OUT/machine.txt"
        echo quit | nvidia-cuda-mps-control
        trap - EXIT
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      fi
    else
      echo "MPS: nvidia-cuda-mps-control -d failed; running without" >>"$OUT/machine.txt"
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  else
    echo "MPS: no nvidia-cuda-mps-control; running without" >>"$OUT/machine.txt"
  fi
fi

pack() {
  tar czf "$OUT/.results.tgz" -C "$RES" --exclude=traces . 2>/dev/null && mv "$OUT/.results.tgz" "$OUT/results.tgz"
  if [ -d "$RES/traces" ]; then
    rm -f "$OUT"/.traces.tgz.*
    tar czf - -C "$RES" traces 2>/dev/null | split -b 15M -a 2 - "$OUT/.traces.tgz."
    local part
    rm -f "$OUT"/traces.tgz.*
    for part in "$OUT"/.traces.tgz.*; do
      [ -e "$part" ] || continue
      mv "$part" "$OUT/${part##*/.}"
    done
    # At most 5 parts come back beside the other three files.
    ls "$OUT"/traces.tgz.* 2>/dev/null | sort | tail -n +6 | xargs -r rm -f
  fi
}

(
  while sleep 20; do pack; done
) &
packer=$!

"$REPO/scripts/nccl-e2e.sh" --out "$RES" "$@" 2>&1 | tee "$OUT/console.log"
rc=${PIPESTATUS[0]}
kill "$packer" 2>/dev/null
wait "$packer" 2>/dev/null
pack
ls -la "$OUT" >>"$OUT/console.log"
exit "$rc"
