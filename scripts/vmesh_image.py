# SPDX-License-Identifier: Apache-2.0
"""The QEMU lab's guest image, for scripts/vmesh: Debian's kernel, the modules the guests
load, the arm64 guests' userland and the initramfs, cached under <build-dir>/<arch's cache>/
(KernelCache), and the helpers both halves of vmesh use (VmeshError, quiet, find_tool,
atomic_write). Standard library only; loaded by path (vmesh.load_helper), not installed."""

import contextlib
import fcntl
import gzip
import hashlib
import io
import lzma
import os
import re
import shlex
import shutil
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path

INIT_SCRIPT = Path(__file__).resolve().parent / "lab" / "initramfs-init.sh"
# Soft-RoCE needs crc32_generic (looked up by algorithm name, so modprobe's
# dependency list does not have it) before rdma_rxe; the rest follow modules.dep.
GUEST_MODULES = ["crc32_generic", "virtio_pci", "virtio_net", "9pnet_virtio", "9p",
                 "overlay", "ib_core", "ib_uverbs", "rdma_rxe"]
# Depends that a guest never runs (maintainer scripts, PAM, the package manager).
USERLAND_SKIP = {"debconf", "debconf-2.0", "base-files", "debianutils", "libcap2-bin",
                 "perl-base", "dpkg", "tar", "libc-bin", "adduser", "passwd",
                 "init-system-helpers", "lsb-base", "sysvinit-utils"}


class VmeshError(Exception):
    """A failure the user can act on; printed without a traceback."""


def write_cpio(entries):
    """newc cpio of (name, mode, data, rdev) tuples; owners are root, mtime 0."""
    out = io.BytesIO()

    def pad(n):
        out.write(b"\0" * (-n % 4))

    for ino, (name, mode, data, rdev) in enumerate(entries + [("TRAILER!!!", 0, b"", (0, 0))], 1):
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
        out.write(b"070701" + "".join("%08x" % f for f in fields).encode())
        out.write(name.encode() + b"\0")
        pad(110 + len(name) + 1)
        out.write(data)
        pad(len(data))
    return out.getvalue()


def merge_usr(root):
    """Moves /bin, /sbin and /lib of an unpacked package tree under /usr, as a merged-/usr
    system has them, so that an overlay of the tree on such a root (whose /bin is a link
    to usr/bin) adds to /usr/bin instead of hiding the root's /bin."""
    for top in ("bin", "sbin", "lib"):
        src = root / top
        if src.is_symlink() or not src.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(src):
            rel = Path(dirpath).relative_to(root)
            dest = root / "usr" / rel
            dest.mkdir(parents=True, exist_ok=True)
            for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
                target = dest / name
                if not target.exists() and not target.is_symlink():
                    os.rename(Path(dirpath) / name, target)
        shutil.rmtree(src)


def extract_vmlinux(bzimage):
    """The ELF kernel inside a bzImage, or None. QEMU boots that ELF directly
    (PVH entry point), which skips decompressing the kernel in the guest: under
    TCG that halves the boot time (Debian compresses with xz)."""
    start = bzimage.find(b"\xfd7zXZ\x00")
    if start < 0:
        return None
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
    except lzma.LZMAError:
        return None
    return elf if elf[:4] == b"\x7fELF" else None


def strip_module_signature(ko):
    """A module without its appended signature. The kernel then skips checking it
    (it only taints itself), which saves seconds of hashing per boot under TCG."""
    magic = b"~Module signature appended~\n"
    if not ko.endswith(magic):
        return ko
    # struct module_signature (12 bytes) precedes the magic; it ends in the
    # big-endian length of the signature, which precedes the struct.
    info_end = len(ko) - len(magic)
    sig_len = struct.unpack(">I", ko[info_end - 4:info_end])[0]
    return ko[:info_end - 12 - sig_len]


def find_tool(name):
    for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/sbin/{name}"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise VmeshError(f"{name} not found; install it (see docs/lab.md, Packages)")


def quiet(cmd, what, **kwargs):
    """Run a helper, showing its output only when it fails."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    if proc.returncode != 0:
        raise VmeshError(f"{what} failed ({shlex.join(cmd)}):\n{proc.stdout.decode(errors='replace')}")
    return proc.stdout.decode(errors="replace")


_apt_updated = False


def apt_update_once():
    """`apt-get update`, at most once per run: apt's lists may be missing (an image that
    cleaned them) or older than the mirror, which drops superseded kernels and libraries.
    False when it was done already (a second failure is then a real one)."""
    global _apt_updated
    if _apt_updated:
        return False
    _apt_updated = True
    quiet(["apt-get", "update", "-qq"], "apt-get update")
    return True


def quiet_apt(cmd, what, **kwargs):
    """quiet() for apt-cache/apt-get download: on failure, update apt's lists once and retry."""
    try:
        return quiet(cmd, what, **kwargs)
    except VmeshError:
        if not apt_update_once():
            raise
        return quiet(cmd, what, **kwargs)


def atomic_write(path, data):
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class KernelCache:
    """Debian's kernel, the modules the guests load, and the initramfs, under
    <build-dir>/vmesh/. Filled once (network needed then), reused offline."""

    def __init__(self, build_dir, arch):
        self.arch = arch
        self.dir = Path(build_dir).resolve() / arch.cache_name
        self.modules = self.dir / "modules"
        self.stamp = self.dir / "kernel.stamp"
        self.userland = self.dir / "userland"  # arm64: the guests' upper layer

    @contextlib.contextmanager
    def locked(self):
        # Two concurrent runs must not both download or pack into the same files.
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def prepare(self):
        """Returns (kernel path, initramfs path); builds what is missing."""
        with self.locked():
            if self._stamp_fields()[2:] != [",".join(GUEST_MODULES)]:
                self._unpack_kernel()
            if self.arch.userland and not (self.userland / ".complete").exists():
                self._unpack_userland()
            return self.dir / self._stamp_fields()[1], self._initramfs()

    def _stamp_fields(self):
        # "<kernel version> <kernel file> <module list>", written last: it says the
        # kernel and the modules for that list are complete.
        return self.stamp.read_text().split() if self.stamp.exists() else []

    def version(self):
        return self._stamp_fields()[0]

    # -- kernel package

    def _unpack_kernel(self):
        deb = self._kernel_deb()
        with tempfile.TemporaryDirectory(prefix="unpack-", dir=self.dir) as tmp:
            root = Path(tmp) / "root"
            quiet(["dpkg-deb", "-x", str(deb), str(root)], "unpacking the kernel package")
            (version,) = os.listdir(root / "lib/modules")
            quiet([find_tool("depmod"), "-b", str(root), version], "depmod")
            self._keep_modules(root / "lib/modules" / version)
            bzimage = (root / "boot" / f"vmlinuz-{version}").read_bytes()
            if self.arch.name == "arm64":
                # A gzip'ed Image: unpacked once here instead of by QEMU at every boot.
                elf, name = None, "Image"
                bzimage = gzip.decompress(bzimage) if bzimage[:2] == b"\x1f\x8b" else bzimage
            else:
                elf = extract_vmlinux(bzimage)
                name = "vmlinux" if elf else "vmlinuz"
            atomic_write(self.dir / name, elf or bzimage)
            atomic_write(self.stamp, f"{version} {name} {','.join(GUEST_MODULES)}\n".encode())

    def _kernel_deb(self):
        """The kernel package: VMESH_KERNEL_DEB, else the one kept from an earlier
        download (so a changed module list needs no network), else apt's."""
        override = os.environ.get("VMESH_KERNEL_DEB")
        if override:
            return Path(override)
        kept = self.dir / "linux-image.deb"
        if not kept.exists():
            package = self._kernel_package()
            with tempfile.TemporaryDirectory(prefix="download-", dir=self.dir) as tmp:
                # apt's sandbox user must be able to write there.
                os.chmod(tmp, 0o755)
                quiet_apt(["apt-get", "download", f"{package}:{self.arch.debian}"],
                          f"downloading {package}", cwd=tmp)
                (deb,) = Path(tmp).glob("linux-image-*.deb")
                os.replace(deb, kept)
        return kept

    def _kernel_package(self):
        # The concrete package that Debian's linux-image-<arch> points at now.
        meta = f"linux-image-{self.arch.debian}"
        pattern = rf"Depends: (linux-image-[0-9][^\s:]*-{self.arch.debian})"
        out = quiet_apt(["apt-cache", "depends", f"{meta}:{self.arch.debian}"], "apt-cache depends")
        found = re.findall(pattern, out)
        if not found and apt_update_once():  # no lists yet: apt-cache answers, but with nothing
            out = quiet(["apt-cache", "depends", f"{meta}:{self.arch.debian}"], "apt-cache depends")
            found = re.findall(pattern, out)
        if not found:
            hint = " (dpkg --add-architecture arm64 first)" if self.arch.name == "arm64" else ""
            raise VmeshError(f"cannot resolve {meta}; run `apt-get update`{hint} "
                             "or set VMESH_KERNEL_DEB=/path/to/linux-image-*.deb")
        return found[0]

    def _keep_modules(self, moddir):
        deps = {}
        for line in (moddir / "modules.dep").read_text().splitlines():
            path, _, rest = line.partition(":")
            deps[Path(path).name.split(".ko")[0]] = (path, rest.split())
        by_path = {path: name for name, (path, _) in deps.items()}
        # Built into this kernel (arm64's has virtio_pci, for one): nothing to load.
        builtin_list = moddir / "modules.builtin"
        builtin = {Path(line).name.split(".ko")[0].replace("-", "_") for line in
                   (builtin_list.read_text().split() if builtin_list.exists() else [])}
        order = []

        def visit(name):
            if name not in deps and name in builtin:
                return
            if name not in deps:
                raise VmeshError(f"kernel {moddir.name} has no module {name}")
            path, needs = deps[name]
            for dep in needs:
                visit(by_path[dep])
            if path not in order:
                order.append(path)

        for name in GUEST_MODULES:
            visit(name)
        shutil.rmtree(self.modules, ignore_errors=True)
        for path in order:
            (self.modules / path).parent.mkdir(parents=True, exist_ok=True)
            (self.modules / path).write_bytes(strip_module_signature((moddir / path).read_bytes()))
        (self.modules / "order").write_text("\n".join(order) + "\n")

    # -- arm64 userland

    def _unpack_userland(self):
        """The guests' upper layer: self.arch.userland and their Depends, downloaded as .debs
        (kept in debs/, so a rebuild needs no network) and unpacked into one merged-/usr tree,
        with a busybox applet link for every command it has no program of its own for."""
        debs = self.dir / "debs"
        debs.mkdir(exist_ok=True)
        os.chmod(debs, 0o755)  # apt's sandbox user writes there
        wanted = self._userland_closure()
        have = {p.name.split("_")[0] for p in debs.glob("*.deb")}
        missing = [f"{p}:{self.arch.debian}" for p in sorted(wanted - have)]
        if missing:
            quiet_apt(["apt-get", "download", *missing], "downloading the arm64 userland", cwd=debs)
        shutil.rmtree(self.userland, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="userland-", dir=self.dir) as tmp:
            root = Path(tmp) / "root"
            for deb in sorted(debs.glob("*.deb")):
                if deb.name.split("_")[0] in wanted:
                    quiet(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {deb.name}")
            merge_usr(root)
            usr_bin = root / "usr" / "bin"
            if not (usr_bin / "sh").is_symlink():
                os.symlink("dash", usr_bin / "sh")
            applets = quiet(["/bin/busybox", "--list"], "busybox --list").split()
            for applet in applets:
                if not any((root / "usr" / d / applet).exists() or
                           (root / "usr" / d / applet).is_symlink() for d in ("bin", "sbin")):
                    os.symlink("busybox", usr_bin / applet)
            os.replace(root, self.userland)
        (self.userland / ".complete").write_text("")

    def _userland_closure(self):
        # Breadth first, one apt-cache call per level: apt-cache loads its whole package cache
        # at every start (about a CPU second), and a call per package made this closure most
        # of the arm64 lab's preparation time (60 calls).
        wanted, level = set(), set(self.arch.userland)
        while True:
            level = {p for p in level if p not in wanted and p not in USERLAND_SKIP}
            if not level:
                return wanted
            wanted |= level
            out = quiet_apt(["apt-cache", "depends", *(f"{p}:{self.arch.debian}" for p in sorted(level))],
                            "apt-cache depends")
            level = {d.split(":")[0] for d in
                     re.findall(r"^\s+\|?(?:Pre)?Depends: ([^<\s]\S*)", out, re.M)}

    # -- initramfs

    def _initramfs(self):
        source = self.userland / "usr/bin/busybox" if self.arch.userland else Path("/bin/busybox")
        busybox = source.read_bytes()
        if b"/lib64/ld-linux" in busybox[:4096]:
            raise VmeshError("/bin/busybox is dynamically linked; install busybox-static")
        init = INIT_SCRIPT.read_bytes()
        order = (self.modules / "order").read_text().split()
        digest = hashlib.sha256(init + busybox)
        for path in order:
            digest.update(path.encode() + (self.modules / path).read_bytes())
        key = digest.hexdigest()[:12]
        path = self.dir / f"initramfs-{key}.cpio.gz"
        if not path.exists():
            atomic_write(path, gzip.compress(self._cpio(init, busybox, order), mtime=0))
            self._prune_initramfs(keep=path)
        return path

    def _prune_initramfs(self, keep):
        # Images of other vmesh versions; a day old, so that a run of another
        # checkout sharing this build directory is not starting from one now.
        for old in self.dir.glob("initramfs-*.cpio.gz"):
            if old != keep and time.time() - old.stat().st_mtime > 86400:
                old.unlink()

    def _cpio(self, init, busybox, order):
        d, f, x = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644, stat.S_IFREG | 0o755
        entries = [(name, d, b"", (0, 0)) for name in
                   ("bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules")]
        entries.append(("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)))
        entries.append(("bin/busybox", x, busybox, (0, 0)))
        applets = quiet(["/bin/busybox", "--list"], "busybox --list").split()
        entries += [(f"bin/{a}", stat.S_IFLNK | 0o777, b"busybox", (0, 0))
                    for a in applets if a != "busybox"]
        entries.append(("init", x, init, (0, 0)))
        for path in order:
            entries.append((f"lib/modules/{Path(path).name}", f,
                            (self.modules / path).read_bytes(), (0, 0)))
        names = "\n".join(Path(p).name for p in order) + "\n"
        entries.append(("modules.order", f, names.encode(), (0, 0)))
        return write_cpio(entries)
