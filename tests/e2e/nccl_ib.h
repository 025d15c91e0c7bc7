// SPDX-License-Identifier: Apache-2.0
// The reference transport: NCCL's own IB transport (net_ib), taken out of an installed
// libnccl.so.2 and driven through the same ncclNet calls as the plugin, on the same devices,
// so a benchmark can set the plugin beside what NCCL itself does on the same links without
// a GPU (`mesh_e2e ... --plugin nccl-ib[:LIB]`; docs/gpu-machine.md has the same comparison
// under real NCCL).
//
// libnccl.so.2 exports no net table: NCCL keeps its IB transport in a local symbol,
// `ncclNetIb`, an ncclNet_v11_t in NCCL 2.28 (its internal ncclNet_t). openNcclIb finds it in
// the library's ELF symbol table (.symtab, present in NVIDIA's packages and PyTorch's wheels)
// and checks its size and name before anything calls it; a stripped library, or a release
// whose internal table is not v11, is refused with the reason.
//
// NCCL's IB init takes each device's PCI path from realpath(/sys/class/infiniband/<dev>/device)
// and crashes without one (NCCL 2.28.9, seen on the GPU machine), and the fabric's devices
// (or a kernel without RDMA) have none: fakeIbSysfs gives this process a private mount
// namespace whose /sys/class has an `infiniband` entry per device (a PCI-looking directory,
// one bus each, RoCE v2 GID types) beside the real classes. Needs root; the mounts end with
// the process and nothing is left behind on the host.
// Owns: the library handle (never closed: NCCL IB's per-device threads run until exit).
#pragma once

#include <string>
#include <vector>

namespace e2e {

struct NcclIb {
  void* lib = nullptr;           // dlopen handle, kept open
  const void* table = nullptr;   // the ncclNet_v11_t
  std::string path;              // the library's file
  int version = 0;               // ncclGetVersion's code, e.g. 22809
};

// dlopen(lib) (a bare name through LD_LIBRARY_PATH, as usual) and locate ncclNetIb. Sets
// NCCL_IB_GID_INDEX=1 (the fabric's RoCE v2 IPv4 GID) unless set. Throws Failure.
NcclIb openNcclIb(const std::string& lib);

// RDMA device names as the verbs library in LD_LIBRARY_PATH lists them (the fabric's
// drop-in: fab_<netdev>). Throws Failure when there is no verbs library.
std::vector<std::string> verbsDeviceNames();

// The private /sys/class described above, with these devices. Throws Failure. Once a process
// has threads, a new mount namespace is the calling thread's (and the threads it starts
// later): call it before starting threads that will call NCCL IB (mesh_replay does, at the
// start of each node), or call NCCL IB from this thread only (mesh_e2e does).
void fakeIbSysfs(const std::vector<std::string>& devices);

// The text after "nccl-ib" in a --plugin value: "" for the default library (libnccl.so.2),
// else the path after the colon; false when `plugin` does not name the reference.
bool parseNcclIbPlugin(const std::string& plugin, std::string* lib);

}  // namespace e2e
