#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# vmesh guest stage 1: /init of the busybox initramfs that scripts/vmesh builds.
#
# Loads the kernel modules the lab needs, mounts the host's root file system
# (read-only 9p) and the run directory (writable 9p), then runs stage 2
# (scripts/lab/guest-stage2.sh, copied into the run directory by the host) chrooted
# into the host's root. Powers the guest off when stage 2 returns, so QEMU exits.
#
# Lines starting with "@@vmesh:" are progress markers that the host parses; keep
# their wording in sync with scripts/vmesh.
export PATH=/bin

marker() { echo "@@vmesh:$*"; }

# Stage 1 failures leave no result file; the marker tells the host why.
die() {
    marker "setup-failed stage1: $*"
    poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

run="" rank="" probe="" layer=""
# shellcheck disable=SC2013  # the command line is a list of words
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        vmesh.run=*) run=${arg#*=} ;;
        vmesh.rank=*) rank=${arg#*=} ;;
        vmesh.probe=*) probe=1 ;;
        vmesh.layer=*) layer=1 ;;
    esac
done

# Accelerator probe: reaching userspace is all that is asked.
if [ -n "$probe" ]; then
    marker "probe-ok"
    poweroff -f
fi
marker "booted"

# Order matters: rdma_rxe needs crc32_generic (requested by name, so not in
# modules.dep), and every module after its dependencies; the host wrote the order.
while read -r mod; do
    insmod "/lib/modules/$mod" || die "insmod $mod failed"
done </modules.order
marker "modules"

root=/newroot
ninep="trans=virtio,version=9p2000.L,msize=512000"
# cache=loose on the read-only root: files do not change under a run, and it
# saves a 9p round trip per stat/open (big under TCG).
if [ -z "$layer" ]; then
    mount -t 9p -o "$ninep,ro,cache=loose" vmroot "$root" || die "cannot mount host root over 9p"
else
    # A guest of another architecture (vmesh --arch arm64): the host's root with the
    # guest's own userland (export vmlayer, merged /usr) laid over it, read-only. Its
    # programs and libraries shadow the host's of the same name; the rest, build trees
    # included, shows through at the host's paths.
    mkdir -p /host /layer
    mount -t 9p -o "$ninep,ro,cache=loose" vmroot /host || die "cannot mount host root over 9p"
    mount -t 9p -o "$ninep,ro,cache=loose" vmlayer /layer || die "cannot mount the userland layer over 9p"
    mount -t overlay overlay -o "lowerdir=/layer:/host" "$root" ||
        die "cannot lay the guest userland over the host root"
fi

# The chroot needs its own kernel file systems and writable scratch space.
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount -t devtmpfs devtmpfs "$root/dev"
mkdir -p "$root/dev/pts" "$root/dev/shm"
mount -t devpts devpts "$root/dev/pts"
for dir in /run /dev/shm; do
    mount -t tmpfs -o mode=1777 tmpfs "$root$dir" || die "cannot mount tmpfs on $dir"
done
# /tmp and /var/tmp stay readable as on the host (a checkout or a build tree can
# live there) but take writes into the guest's memory: overlays on a tmpfs.
mkdir -p /scratch
mount -t tmpfs tmpfs /scratch
for dir in /tmp /var/tmp; do
    mkdir -p "/scratch$dir/upper" "/scratch$dir/work"
    chmod 1777 "/scratch$dir/upper"
    mount -t overlay overlay \
        -o "lowerdir=$root$dir,upperdir=/scratch$dir/upper,workdir=/scratch$dir/work" \
        "$root$dir" || die "cannot mount an overlay on $dir"
done

# The run directory (control files + VMESH_SHARED) appears at the host's path.
# cache=none: guests and host must see each other's writes at once.
mkdir -p "$root$run"
mount -t 9p -o "$ninep,cache=none" vmrun "$root$run" || die "cannot mount run directory $run"

marker "mounted"

env -i HOME=/tmp TERM=dumb PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    VMESH_RUN="$run" VMESH_RANK="$rank" \
    chroot "$root" /bin/sh "$run/ctl/guest-stage2.sh"

sync
poweroff -f
