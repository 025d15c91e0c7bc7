#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# admin_package: cpack's .deb and .tar.gz, unpacked into clean directories, hold a working
# install: the plugin loads as NCCL loads it by absolute path and by name through
# LD_LIBRARY_PATH (and has ncclNetPlugin_v8..v11), the binaries are stripped with their
# debug info in .debug/ beside them, the docs are in share/doc/nccl-mesh, the tools run.
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
tgz="$tmp/out/nccl-mesh-$version-Linux.tar.gz"
[ -f "$deb" ] || { ls -l "$tmp/out"; echo "FAIL admin_package: no nccl-mesh_${version}_<arch>.deb"; exit 1; }
[ -f "$tgz" ] || { ls -l "$tmp/out"; echo "FAIL admin_package: no ${tgz##*/}"; exit 1; }
for f in "$deb" "$tgz"; do
    echo "package: ${f##*/} $(wc -c <"$f") bytes"
done
echo "deb: $(dpkg-deb -f "$deb" Package Version Architecture Depends Recommends | tr '\n' ' ')"

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
check_tree "$tmp/tgz/nccl-mesh-$version-Linux"

[ "$fails" -eq 0 ] && echo "PASS admin_package: .deb and .tar.gz install and load"
[ "$fails" -eq 0 ]
