#!/usr/bin/env python3
"""All-reduce through real NCCL (PyTorch) on the meshfab fabric: one rank per fabric-net
node, every rank on the same GPU (each node has its own NCCL_HOSTID, so NCCL treats the
ranks as separate nodes and moves data over its network transport: NCCL's own IB
transport with NCCL_NET=IB, the nccl-mesh plugin with NCCL_NET_PLUGIN=mesh NCCL_NET=Mesh).
GPUDirect is off (NCCL_NET_GDR_LEVEL=LOC): the fabric knows host memory only.

    scripts/fabric-net run --nodes 2 --dropin --env NCCL_NET=IB -- python3 tests/fabric/gpu/torch_allreduce.py

Prints "PASS torch-allreduce rank=R ..." with the bus bandwidth per size, or raises.
"""
import argparse
import os
import sys
import time

rank = int(os.environ["VMESH_RANK"])
world = int(os.environ["VMESH_NODES"])
os.environ.setdefault("NCCL_HOSTID", f"meshfab-node{rank}")
os.environ.setdefault("NCCL_SOCKET_IFNAME", "mgmt")
os.environ.setdefault("NCCL_NET_GDR_LEVEL", "LOC")

import torch  # noqa: E402  (NCCL reads the environment at init)
import torch.distributed as dist  # noqa: E402


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4K,1M,64M", help="bytes per all-reduce (float32)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--port", type=int, default=29511)
    args = ap.parse_args()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://198.19.0.1:{args.port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda:0"))
    expected = world * (world + 1) / 2
    results = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        n = max(1, size // 4)
        x = torch.empty(n, dtype=torch.float32, device="cuda")
        times = []
        for _ in range(args.iters + 1):
            x.fill_(rank + 1.0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            bad = (x != expected).sum().item()
            if bad:
                raise SystemExit(f"FAIL torch-allreduce rank={rank}: {bad} of {n} elements wrong "
                                 f"(first {x[(x != expected).nonzero()[0]].item()}, want {expected})")
        t = sorted(times[1:])[len(times[1:]) // 2]
        busbw = 2 * (world - 1) / world * n * 4 / t / 1e9
        results.append(f"{size}B:{t * 1e3:.2f}ms/{busbw:.2f}GB/s")
    dist.destroy_process_group()
    print(f"PASS torch-allreduce rank={rank} world={world} net={os.environ.get('NCCL_NET', 'default')} "
          f"torch={torch.__version__} nccl={'.'.join(map(str, torch.cuda.nccl.version()))} "
          f"median(time/busbw)=[{' '.join(results)}]", flush=True)


if __name__ == "__main__":
    main()
