#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One rank of scripts/nccl-e2e.sh: real NCCL (through PyTorch) driving a network.

Started once per rank by nccl-e2e.sh, each rank in its own network namespace and with its
own NCCL_HOSTID, so NCCL treats the ranks as separate nodes even though they share one
GPU. Which network NCCL uses (the mesh plugin, NCCL's IB transport on the fabric, ...) is
decided entirely by the environment nccl-e2e.sh gives it; this file only runs
collectives, checks every result exactly and times them.

For every collective and size it prints (rank 0) an nccl-tests-style row and writes one
JSON object per row to --json:
  {"coll", "bytes", "count", "time_us", "algbw", "busbw", "wrong", "iters"}
algbw = bytes / time; busbw = algbw * the collective's bus factor (nccl-tests'
definitions: all_reduce 2(n-1)/n, all_gather and reduce_scatter and alltoall (n-1)/n,
broadcast and sendrecv 1).

Values are small integers in float32, so every expected result is exact: a single wrong
element is counted. Each measurement is preceded by a check iteration whose output was
poisoned with NaN first, so an output that NCCL never wrote cannot pass.

Standard library + torch only. Exit status: 0 all correct, 1 a wrong result, 2 an error.
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall", "sendrecv"]
ELEM = 4  # float32


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def pattern(count, salt, dev):
    """Small exact integers: salt + (i mod 13) * 16."""
    i = torch.arange(count, device=dev, dtype=torch.int64)
    return (salt + (i % 13) * 16).to(torch.float32)


class Case:
    """One collective at one size: inputs, a poisoned output, the op and its expected result."""

    def __init__(self, coll, nbytes, rank, n, dev, peers):
        self.coll, self.rank, self.n, self.dev, self.peers = coll, rank, n, dev, peers
        unit = n if coll in ("all_gather", "reduce_scatter", "alltoall") else 1
        count = max(nbytes // ELEM, 1)
        count = max((count // unit) * unit, unit)
        self.count = count
        self.nbytes = count * ELEM
        r = rank
        if coll == "all_reduce":
            self.inp = pattern(count, r + 1, dev)
            self.out = self.inp  # in place: re-filled before every call
            self.expect = pattern(count, 0, dev) * n + sum(range(1, n + 1))
        elif coll == "all_gather":
            per = count // n
            self.inp = pattern(per, 1000 * (r + 1), dev)
            self.out = torch.empty(count, device=dev)
            self.expect = torch.cat([pattern(per, 1000 * (j + 1), dev) for j in range(n)])
        elif coll == "reduce_scatter":
            per = count // n
            self.inp = pattern(count, r + 1, dev)
            self.out = torch.empty(per, device=dev)
            full = pattern(count, 0, dev) * n + sum(range(1, n + 1))
            self.expect = full[r * per:(r + 1) * per].clone()
        elif coll == "broadcast":
            self.inp = pattern(count, 7, dev) if r == 0 else torch.empty(count, device=dev)
            self.out = self.inp
            self.expect = pattern(count, 7, dev)
        elif coll == "alltoall":
            per = count // n
            # Chunk j goes to rank j and says who sent it to whom.
            self.inp = torch.cat([pattern(per, 100 * (r + 1) + j, dev) for j in range(n)])
            self.out = torch.empty(count, device=dev)
            self.expect = torch.cat([pattern(per, 100 * (j + 1) + r, dev) for j in range(n)])
        elif coll == "sendrecv":
            # One batch_isend_irecv: a message to and from every peer in `peers`.
            self.inp = {p: pattern(count, 100 * (r + 1) + p, dev) for p in peers}
            self.out = {p: torch.empty(count, device=dev) for p in peers}
            self.expect = {p: pattern(count, 100 * (p + 1) + r, dev) for p in peers}
        else:
            raise ValueError(coll)

    def refill(self):
        if self.coll == "all_reduce":
            self.inp.copy_(pattern(self.count, self.rank + 1, self.dev))
        elif self.coll == "broadcast" and self.rank == 0:
            self.inp.copy_(self.expect)

    def poison(self):
        if self.coll == "sendrecv":
            for t in self.out.values():
                t.fill_(float("nan"))
        elif self.coll == "broadcast" and self.rank == 0:
            pass  # the root's buffer is the source
        elif self.coll == "all_reduce":
            pass  # in place: refill() rewrites the input
        else:
            self.out.fill_(float("nan"))

    def run(self):
        c = self.coll
        if c == "all_reduce":
            dist.all_reduce(self.inp)
        elif c == "all_gather" and self.dev.type == "cpu":
            # Rehearsal: older gloo has no all_gather_into_tensor; the list form fills views of out.
            dist.all_gather(list(self.out.chunk(self.n)), self.inp)
        elif c == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif c == "reduce_scatter" and self.dev.type == "cpu":
            # Rehearsal: gloo has no reduce_scatter; an all_reduce and this rank's slice give the same result.
            full = self.inp.clone()
            dist.all_reduce(full)
            per = self.count // self.n
            self.out.copy_(full[self.rank * per:(self.rank + 1) * per])
        elif c == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp)
        elif c == "broadcast":
            dist.broadcast(self.inp, src=0)
        elif c == "alltoall":
            dist.all_to_all_single(self.out, self.inp)
        elif c == "sendrecv":
            ops = []
            for p in self.peers:
                ops.append(dist.P2POp(dist.irecv, self.out[p], p))
                ops.append(dist.P2POp(dist.isend, self.inp[p], p))
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    def wrong(self):
        if self.coll == "sendrecv":
            return sum(int((self.out[p] != self.expect[p]).sum().item()) for p in self.peers)
        return int((self.out != self.expect).sum().item())


def node_env(rank):
    """What makes this rank its own NCCL node, set before NCCL reads its environment.

    NCCL_HOSTID: NCCL derives a host's identity from it, so ranks sharing the one GPU are
    separate nodes and talk over the network. NCCL_IB_HCA (only where the caller asked for
    it with NCCL_E2E_IB_HCA=auto): this node's fabric devices, as a user of stock NCCL
    would list their RDMA NICs (cables p<j>..., a switch port sw, swf1); the fabric names the
    device on netdev X `fab_X`."""
    os.environ.setdefault("NCCL_HOSTID", f"nccl-e2e-node{rank}")
    if os.environ.get("NCCL_E2E_IB_HCA") == "auto":
        import socket
        nics = sorted(name for _, name in socket.if_nameindex() if name.startswith(("p", "sw")))
        os.environ["NCCL_IB_HCA"] = ",".join("=fab_" + n if i == 0 else "fab_" + n for i, n in enumerate(nics))
        fake_ib_sysfs(["fab_" + n for n in nics])


def fake_ib_sysfs(devices):
    """/sys/class/infiniband/<dev> for the fabric's devices, in this process's own mount namespace.

    NCCL's IB transport takes a NIC's PCI path from realpath(/sys/class/infiniband/<dev>/device);
    the fabric's devices have none, and NCCL 2.28.9 then dies with SIGSEGV after 'Could not find
    real path of fab_p1' (seen on the GPU machine). Each device gets a directory named like a PCI
    function (0000:0N:00.0, one bus per device so NCCL does not merge them as ports of one NIC)
    without a 'subsystem' link: NCCL treats it as a virtual NIC attached to the first CPU. Also
    ports/1/gid_attrs/types/<i> ('RoCE v2'). Needs root; the mounts vanish with the process."""
    import atexit
    import ctypes
    import tempfile
    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec, ms_private, clone_newns = 4096, 16384, 1 << 18, 0x00020000

    def mount(src, dst, flags, fstype=None):
        if libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")

    if libc.unshare(clone_newns) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    mount(None, "/", ms_rec | ms_private)
    # Everything lives on a tmpfs seen only in this namespace: at exit it is detached and the
    # (then empty) directory removed; nothing is ever deleted through a mount.
    root = tempfile.mkdtemp(prefix="nccl-e2e-ibsys-")
    mount("tmpfs", root, 0, "tmpfs")

    def cleanup():
        libc.umount2(root.encode(), 2)  # MNT_DETACH
        try:
            os.rmdir(root)
        except OSError:
            pass
    atexit.register(cleanup)
    ib = os.path.join(root, "infiniband")
    os.makedirs(ib)
    for i, dev in enumerate(devices):
        pci = os.path.join(root, "pci", f"0000:{i + 1:02x}:00.0")
        os.makedirs(pci)
        os.makedirs(os.path.join(ib, dev, "ports", "1", "gid_attrs", "types"))
        os.symlink(pci, os.path.join(ib, dev, "device"))
        for g in (0, 1):
            with open(os.path.join(ib, dev, "ports", "1", "gid_attrs", "types", str(g)), "w") as f:
                f.write("RoCE v2\n")
    if os.path.isdir("/sys/class/infiniband"):
        mount(ib, "/sys/class/infiniband", ms_bind)
    else:
        # No RDMA in this kernel: /sys/class gets a stand-in whose entries lead to the real
        # sysfs (bound beside it), plus infiniband.
        real = os.path.join(root, "sys")
        os.makedirs(real)
        mount("/sys", real, ms_bind | ms_rec)
        cls = os.path.join(root, "class")
        os.makedirs(cls)
        for entry in os.listdir(os.path.join(real, "class")):
            os.symlink(os.path.join(real, "class", entry), os.path.join(cls, entry))
        os.symlink(ib, os.path.join(cls, "infiniband"))
        mount(cls, "/sys/class", ms_bind)
    for dev in devices:
        path = os.path.realpath(f"/sys/class/infiniband/{dev}/device")
        if not os.path.isdir(path):
            raise OSError(f"fake sysfs: {dev} has no device directory ({path})")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed_us(dev, fn, iters):
    """Microseconds per call of fn: CUDA events on a GPU, the host clock on the CPU."""
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000.0 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e6 / iters


def sizes_between(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def iterations(nbytes, budget_bytes, lo, hi):
    return max(lo, min(hi, budget_bytes // max(nbytes, 1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--colls", default=",".join(COLLECTIVES))
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iter-bytes", default="1G", help="bytes to move per timed size (sets the iteration count)")
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--peers", default="all", help="sendrecv peers: 'all' or 'ring' (rank+-1)")
    ap.add_argument("--second-comm", action="store_true",
                    help="after the runs, destroy the process group and create a new one (NCCL "
                         "finalizes the plugin at refcount 0 and loads it again), then all_reduce")
    ap.add_argument("--json", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for any NCCL call")
    ap.add_argument("--rehearse", action="store_true",
                    help="no GPU, no NCCL: the same collectives and checks with PyTorch's gloo backend "
                         "on the CPU (tests this driver and the namespaces; measures nothing of interest)")
    args = ap.parse_args()

    # Under scripts/fabric-net every rank is one node: VMESH_RANK/VMESH_NODES, management
    # network 198.19.0.(rank+1). Plain RANK/WORLD_SIZE/MASTER_ADDR win when given.
    rank = int(os.environ.get("RANK", os.environ.get("VMESH_RANK", "-1")))
    n = int(os.environ.get("WORLD_SIZE", os.environ.get("VMESH_NODES", "0")))
    if rank < 0 or n < 1:
        raise SystemExit("RANK/WORLD_SIZE (or fabric-net's VMESH_RANK/VMESH_NODES) are not set")
    addr = os.environ.get("MASTER_ADDR", "198.19.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    node_env(rank)
    timeout = datetime.timedelta(seconds=args.timeout)
    if args.rehearse:
        dev, backend, extra = torch.device("cpu"), "gloo", {}
    else:
        torch.cuda.set_device(0)
        dev, backend = torch.device("cuda", 0), "nccl"
        extra = {"device_id": dev}  # eager: NCCL's communicator exists when init returns

    def init(p):
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{p}", rank=rank, world_size=n,
                                timeout=timeout, **extra)

    t0 = time.time()
    init(port)
    if rank == 0:
        net = "gloo on the CPU (rehearsal)" if args.rehearse else \
            "NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
        print(f"# nccl-e2e {args.label}: {n} ranks, {net}, torch {torch.__version__}, "
              f"init {time.time() - t0:.2f} s", flush=True)
    if args.peers == "ring":
        peers = sorted({(rank + 1) % n, (rank - 1) % n} - {rank})
    else:
        peers = [p for p in range(n) if p != rank]

    colls = [c for c in args.colls.split(",") if c]
    sizes = sizes_between(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    budget = parse_size(args.iter_bytes)
    rows, bad = [], 0
    jf = open(args.json, "w") if (args.json and rank == 0) else None
    for coll in colls:
        if rank == 0:
            print(f"#\n# {coll} ({args.label})\n# {'size':>12} {'count':>12} {'time(us)':>10} "
                  f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>7}", flush=True)
        for s in sizes:
            case = Case(coll, s, rank, n, dev, peers)
            # Check first, on a poisoned output.
            case.refill()
            case.poison()
            case.run()
            sync(dev)
            wrong = case.wrong()
            for _ in range(args.warmup):
                case.refill()
                case.run()
            iters = iterations(case.nbytes, budget, args.min_iters, args.max_iters)
            dist.barrier()
            sync(dev)
            us = timed_us(dev, case.run, iters)  # all_reduce repeats in place: only time matters
            # The slowest rank's time and every rank's wrong count.
            stats = torch.tensor([us, float(wrong)], device=dev, dtype=torch.float64)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            wrong_all = torch.tensor([wrong], device=dev, dtype=torch.int64)
            dist.all_reduce(wrong_all)
            us, wrong_total = stats[0].item(), int(wrong_all.item())
            algbw = case.nbytes / us / 1e3
            busbw = algbw * bus_factor(coll, n)
            bad += wrong_total
            row = {"coll": coll, "bytes": case.nbytes, "count": case.count, "time_us": round(us, 2),
                   "algbw": round(algbw, 4), "busbw": round(busbw, 4), "wrong": wrong_total, "iters": iters}
            rows.append(row)
            if rank == 0:
                print(f"  {case.nbytes:>12} {case.count:>12} {us:>10.1f} {algbw:>11.3f} {busbw:>11.3f} "
                      f"{wrong_total:>7}", flush=True)
                if jf:
                    jf.write(json.dumps(dict(row, label=args.label)) + "\n")
                    jf.flush()
            del case
    if args.second_comm:
        dist.destroy_process_group()
        init(port + 1)
        x = torch.full((1 << 20,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        sync(dev)
        ok = bool((x == n * (n + 1) / 2).all().item())
        if rank == 0:
            print(f"# second communicator: all_reduce of 4 MiB {'exact' if ok else 'WRONG'}", flush=True)
        bad += 0 if ok else 1
    dist.destroy_process_group()
    if jf:
        jf.close()
    if rank == 0:
        print(f"# {args.label}: {len(rows)} measurements, {bad} wrong element(s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a failed NCCL call: say which rank and why, never hang
        print(f"[rank {os.environ.get('RANK', '?')}] ERROR: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
