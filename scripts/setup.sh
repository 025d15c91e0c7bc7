#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# setup.sh: everything nccl-mesh needs to build and test, from a fresh Debian/Ubuntu box.
#   1. installs missing packages (apt-get runs only when something is missing),
#   2. configures and builds into build/ (RelWithDebInfo),
#   3. prepares the virtual RDMA lab's guest kernel and initramfs (scripts/vmesh prepare).
# Idempotent and quiet: prints a short summary; the tools' own output goes to
# build/setup.log, whose tail is printed when a step fails.
#
#   scripts/setup.sh [--no-build] [--no-lab]
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/setup.sh [--no-build] [--no-lab]

Installs the packages nccl-mesh needs (only those missing; apt-get update only when an
install is needed; arm64 multiarch for the arm64 tier), builds into build/, and prepares the QEMU lab (scripts/vmesh prepare).
  --no-build   install packages only (and prepare the lab unless --no-lab)
  --no-lab     do not prepare the lab's kernel/initramfs cache
Runs as root, or as a user with sudo. Output of apt and cmake: build/setup.log.
EOF
}

# Building and the unit/abi tiers; the fabric tier (userspace RDMA on network namespaces:
# iproute2, util-linux's nsenter, rdma-core's tools and perftest run on it, ping for mgmt).
REQUIRED_PACKAGES=(
  build-essential cmake g++ pkg-config binutils file python3 iproute2 util-linux iputils-ping
  libgtest-dev googletest libgmock-dev
  rdma-core libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils perftest
)
# The compiler cache (every build of the suite goes through it when present: CMakeLists.txt,
# MESH_CCACHE), the fuzz tier (clang + its compiler-rt: libFuzzer, sanitizers; only Recommended
# by clang, so --no-install-recommends would leave it out) and the lab tier (QEMU guests).
# A failed install is fatal on Debian (install_optional), a warning elsewhere: those tiers say why.
OPTIONAL_PACKAGES=(
  ccache clang libclang-rt-dev
  qemu-system-x86 busybox-static cpio kmod
)

# The arm64 tier and the aarch64 lab (issue 17): the cross compiler, arm64 multiarch rdma-core
# and GoogleTest, the arm64 C++ runtime that qemu-aarch64 runs the tests with, and QEMU for
# aarch64 (user mode for the tier, system mode for `scripts/vmesh --arch arm64`). Needs
# `dpkg --add-architecture arm64`, which install_packages adds when one of these is missing.
# Optional like the ones above (a failed install is fatal on Debian only): without them the
# arm64 tier reports what is missing. The aarch64 guests' own packages (kernel, busybox,
# iproute2, ibverbs-utils) are not installed: scripts/vmesh --arch arm64 fetches them with
# `apt-get download` into build/vmesh-arm64.
ARM64_PACKAGES=(
  g++-aarch64-linux-gnu qemu-user-static qemu-system-arm
  libc6:arm64 libstdc++6:arm64 libgcc-s1:arm64
  libibverbs-dev:arm64 ibverbs-providers:arm64 libgtest-dev:arm64 libgmock-dev:arm64
)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR="$REPO/build"
LOG="$BUILD_DIR/setup.log"
do_build=1
do_lab=1

log_tail_and_die() {
  echo "setup: FAILED: $1" >&2
  echo "----- last lines of $LOG -----" >&2
  tail -n 40 "$LOG" >&2 || true
  echo "------------------------------" >&2
  exit 1
}

# Runs a command with its output appended to the log; dies with the log tail on failure.
quietly() {
  local what=$1
  shift
  echo "+ $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 || log_tail_and_die "$what"
}

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
}

missing_from() {
  local p
  for p in "$@"; do
    is_installed "$p" || printf '%s\n' "$p"
  done
}

# apt-get as root: directly, else through sudo (install_packages checked it exists).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  else
    sudo "$@"
  fi
}

apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@"
}

install_packages() {
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: not a Debian/Ubuntu system; install the equivalents of:" \
         "${REQUIRED_PACKAGES[*]} ${OPTIONAL_PACKAGES[*]}"
    return
  fi
  local required optional
  mapfile -t required < <(missing_from "${REQUIRED_PACKAGES[@]}")
  mapfile -t optional < <(missing_from "${OPTIONAL_PACKAGES[@]}")
  local arm64
  mapfile -t arm64 < <(missing_from "${ARM64_PACKAGES[@]}")
  if [ ${#required[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && [ ${#arm64[@]} -eq 0 ]; then
    echo "setup: packages: all $(( ${#REQUIRED_PACKAGES[@]} + ${#OPTIONAL_PACKAGES[@]} + ${#ARM64_PACKAGES[@]} )) present"
    return
  fi
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing packages: ${required[*]} ${optional[*]} ${arm64[*]}" >&2
    echo "setup: installing them needs root: run as root or install sudo" >&2
    exit 1
  fi
  if [ ${#arm64[@]} -gt 0 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    # Debian's mirrors carry every architecture; Ubuntu's amd64 mirror has no arm64 (that is
    # ports.ubuntu.com), and an arm64 architecture without such a source fails apt-get update.
    if grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
      quietly "dpkg --add-architecture arm64" as_root dpkg --add-architecture arm64
    else
      echo "setup: warning: not adding the arm64 architecture on this distribution (its arm64" \
           "packages need a ports mirror in apt's sources); the arm64 tier will say what is missing"
      arm64=()
      [ ${#required[@]} -gt 0 ] || [ ${#optional[@]} -gt 0 ] || return 0
    fi
  fi
  # A run killed inside apt-get install leaves dpkg interrupted, and apt then refuses every
  # install until it is finished; nothing to do (and quick) otherwise.
  quietly "dpkg --configure -a" as_root env DEBIAN_FRONTEND=noninteractive dpkg --configure -a
  quietly "apt-get update" as_root apt-get update -qq
  if [ ${#required[@]} -gt 0 ]; then
    quietly "installing ${required[*]}" apt_install "${required[@]}"
    echo "setup: packages: installed ${required[*]}"
  fi
  install_optional "the fuzz and lab tiers need them" "${optional[@]}"
  install_optional "the arm64 tier and the aarch64 lab need them" "${arm64[@]}"
}

# install_optional WHO_NEEDS_THEM PACKAGE...: installs them if any are given. On Debian, the
# system CI and the README's commands target, where every one of them exists, a failure is
# fatal: the tiers that need them would otherwise report "skipped" and the run still pass.
# Elsewhere it is a warning naming who needs them.
install_optional() {
  local who=$1
  shift
  [ $# -gt 0 ] || return 0
  echo "+ apt-get install $*" >>"$LOG"
  if apt_install "$@" >>"$LOG" 2>&1; then
    echo "setup: packages: installed $*"
  elif grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
    log_tail_and_die "installing $* ($who)"
  else
    echo "setup: warning: could not install $* (see $LOG); $who"
  fi
}

build() {
  local start=$SECONDS
  # Tests and -Werror are off for consumers (CMakeLists.txt); developers and CI want both.
  quietly "cmake configure" cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMESH_BUILD_TESTS=ON -DMESH_WERROR=ON
  quietly "build" cmake --build "$BUILD_DIR" -j"$(nproc)"
  echo "setup: build: build/ (RelWithDebInfo) ok ($((SECONDS - start)) s)"
}

prepare_lab() {
  if [ ! -x "$REPO/scripts/vmesh" ]; then
    echo "setup: lab: skipped (scripts/vmesh not present)"
    return
  fi
  quietly "scripts/vmesh prepare (the lab's guest kernel; needs network the first time)" \
    "$REPO/scripts/vmesh" prepare --build "$BUILD_DIR"
  echo "setup: lab: guest kernel and initramfs ready (build/vmesh)"
}

main() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-build) do_build=0 ;;
      --no-lab) do_lab=0 ;;
      -h|--help) usage; exit 0 ;;
      *) echo "setup: unknown option '$1'" >&2; usage >&2; exit 64 ;;
    esac
    shift
  done
  mkdir -p "$BUILD_DIR"
  : >"$LOG"
  install_packages
  if [ "$do_build" -eq 1 ]; then build; fi
  if [ "$do_lab" -eq 1 ]; then prepare_lab; fi
}

main "$@"
