#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# admin_package: cpack's .deb and .tar.gz, unpacked into clean directories, hold a working
# install: the plugin loads as NCCL loads it by absolute path and by name through
# LD_LIBRARY_PATH (and has ncclNetPlugin_v8..v12), the binaries are stripped with their
# debug info in .debug/ beside them, the docs are in share/doc/nccl-mesh, the tools run.
# Also: the tarball names the machine its plugin is for, the .deb depends on nothing the
# plugin only dlopens, the plugin is built with the stack protector, and its glibc floor
# (printed) lets a package built on a glibc < 2.38 machine load on Ubuntu 22.04 (glibc 2.35).
#
# usage: package_check.sh BUILD_DIR LOAD_LIKE_NCCL SOURCE_DIR VERSION
set -u
build=$1 loader=$2 source=$3 version=$4
fails=0
fail() { echo "FAIL admin_package: $*"; fails=$((fails + 1)); }

tmp=$(mktemp -d "$build/admin-package.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

if ! cpack --config "$build/CPackConfig.cmake" -B "$tmp/out" >"$tmp/cpack.log" 2>&1; then
    cat "$tmp/cpack.log"
    echo "FAIL admin_package: cpack failed"
    exit 1
fi
deb=$(ls "$tmp"/out/nccl-mesh_"$version"_*.deb 2>/dev/null | head -n 1)
tgz=$(ls "$tmp"/out/nccl-mesh-"$version"-Linux-*.tar.gz 2>/dev/null | head -n 1)
[ -f "$deb" ] || { ls -l "$tmp/out"; echo "FAIL admin_package: no nccl-mesh_${version}_<arch>.deb"; exit 1; }
[ -f "$tgz" ] || { ls -l "$tmp/out"; echo "FAIL admin_package: no nccl-mesh-$version-Linux-<machine>.tar.gz"; exit 1; }
tgz_dir=${tgz##*/}
tgz_dir=${tgz_dir%.tar.gz}
machine=${tgz_dir#nccl-mesh-"$version"-Linux-}
for f in "$deb" "$tgz"; do
    echo "package: ${f##*/} $(wc -c <"$f") bytes"
done
echo "deb: $(dpkg-deb -f "$deb" Package Version Architecture Depends Recommends | tr '\n' ' ')"
depends=$(dpkg-deb -f "$deb" Depends)
echo "$depends" | grep -qE 'ibverbs|cuda|nccl' &&
    fail "the .deb depends on '$depends': the plugin dlopens libibverbs and libcuda (Recommends at most)"

# check_machine LIB: the plugin is for the machine the tarball's name and the .deb say.
check_machine() {
    kind=$(file -bL "$1")
    case $machine in
        x86_64) want='x86-64' arch=amd64 ;;
        aarch64) want='ARM aarch64' arch=arm64 ;;
        *) fail "tarball machine '$machine' is neither x86_64 nor aarch64"; return ;;
    esac
    echo "$kind" | grep -q "$want" || fail "${tgz##*/} names $machine but its plugin is: $kind"
    [ "$(dpkg-deb -f "$deb" Architecture)" = "$arch" ] ||
        fail "the .deb's Architecture is $(dpkg-deb -f "$deb" Architecture), the tarball's machine $machine"
}

# check_floor LIB: the newest glibc / libstdc++ symbol versions it needs, printed; built on a
# glibc < 2.38 (no C23 strtol remap) it must load on Ubuntu 22.04: GLIBC_2.35, GLIBCXX_3.4.30.
check_floor() {
    glibc=$(objdump -T "$1" | grep -oE 'GLIBC_2\.[0-9]+' | sort -t. -k2 -n | tail -n 1)
    glibcxx=$(objdump -T "$1" | grep -oE 'GLIBCXX_3\.4\.[0-9]+' | sort -t. -k3 -n | tail -n 1)
    host=$(getconf GNU_LIBC_VERSION | sed 's/^glibc //')
    echo "floor: $glibc $glibcxx (built with glibc $host)"
    if [ "${host#2.}" -lt 38 ] 2>/dev/null; then
        [ "${glibc#GLIBC_2.}" -le 35 ] || fail "the plugin needs $glibc: it would not load on Ubuntu 22.04 (2.35)"
        [ "${glibcxx#GLIBCXX_3.4.}" -le 30 ] ||
            fail "the plugin needs $glibcxx: it would not load on Ubuntu 22.04 (GLIBCXX_3.4.30)"
    fi
    nm -D "$1" | grep -q ' U __stack_chk_fail' || fail "the plugin is built without the stack protector"
}

# check_tree ROOT: the installed tree under ROOT (what --prefix would be).
check_tree() {
    root=$1
    lib=$root/lib/libnccl-net-mesh.so
    echo "--- $root"
    (cd "$root" && find . -type f | sort | sed 's/^/  /')
    for f in "$lib" "$root/bin/nccl-mesh-info" "$root/bin/nccl-mesh-perf"; do
        name=${f##*/}
        debug=${f%/*}/.debug/$name.debug
        [ -f "$f" ] || { fail "$f missing"; continue; }
        readelf -S "$f" | grep -q '\.debug_info' && fail "$name still has .debug_info (not stripped)"
        readelf -p .gnu_debuglink "$f" 2>/dev/null | grep -q "$name.debug" ||
            fail "$name has no .gnu_debuglink naming $name.debug"
        [ -f "$debug" ] && readelf -S "$debug" 2>/dev/null | grep -q '\.debug_info' ||
            fail "$debug missing or without .debug_info"
    done
    for doc in README.md CHANGELOG.md LICENSE docs/dgx-spark.md; do
        [ -s "$root/share/doc/nccl-mesh/$doc" ] || fail "share/doc/nccl-mesh/$doc missing"
    done
    [ -x "$root/share/nccl-mesh/plot-perf.py" ] || fail "share/nccl-mesh/plot-perf.py missing"
    grep -qF "$source" "$lib" && fail "the installed plugin contains the build's source path $source"
    check_machine "$lib"
    check_floor "$lib"
    env -u LD_LIBRARY_PATH "$loader" --init "$lib" || fail "loading $lib by absolute path"
    env LD_LIBRARY_PATH="$root/lib" "$loader" --expect-file "$lib" mesh ||
        fail "loading 'mesh' by name through LD_LIBRARY_PATH=$root/lib"
    for tool in nccl-mesh-info nccl-mesh-perf; do
        out=$("$root/bin/$tool" --version 2>&1)
        echo "$out"
        echo "$out" | grep -q "^$tool: nccl-mesh $version" || fail "$tool --version printed '$out'"
    done
}

dpkg -x "$deb" "$tmp/deb" || fail "dpkg -x failed"
check_tree "$tmp/deb/usr"
mkdir "$tmp/tgz" && tar -xzf "$tgz" -C "$tmp/tgz" || fail "tar -xzf failed"
check_tree "$tmp/tgz/$tgz_dir"

[ "$fails" -eq 0 ] && echo "PASS admin_package: .deb and .tar.gz install and load"
[ "$fails" -eq 0 ]
