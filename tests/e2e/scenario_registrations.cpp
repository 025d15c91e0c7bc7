// SPDX-License-Identifier: Apache-2.0
// Registration where the connection runs (issue 32): rank 0 registers buffers of NCCL's usual
// sizes through its send comm to rank 1, and again through no comm (what every registration
// did before: every RDMA device of the node). Per size, the figures: the devices that got a
// registration (the fabric's or the kernel's MR counts per device), the bytes pinned, and
// the time of one regMr (median over --count fresh buffers, none of them cached). The comm's
// registrations must cover exactly the devices towards rank 1, and fewer than the node's.
#include <algorithm>
#include <chrono>
#include <sstream>

#include "comm_setup.h"
#include "probes.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

// MRs per device, from `rdma res show` (or the fabric's stats).
std::map<std::string, long> mrsPerDevice() {
  RdmaResources r = rdmaResources();
  if (!r.ok) fail("registrations: cannot count MRs: %s", r.error.c_str());
  std::map<std::string, long> out;
  for (const auto& kv : r.perDevice) {
    std::istringstream in(kv.second);
    std::string key;
    long v = 0;
    while (in >> key >> v) {
      if (key == "mr") out[kv.first] = v;
    }
  }
  return out;
}

struct Figures {
  int devices = 0;          // devices whose MR count rose with the first registration
  double medianUs = 0;
};

Figures measure(Context& ctx, void* comm, size_t size, int count) {
  std::vector<HostBuffer> bufs;
  for (int i = 0; i < count; ++i) bufs.emplace_back(size);
  std::vector<void*> mhs;
  std::vector<double> us;
  Figures f;
  for (int i = 0; i < count; ++i) {
    std::map<std::string, long> before = i == 0 ? mrsPerDevice() : std::map<std::string, long>();
    auto t0 = Clock::now();
    mhs.push_back(regHost(ctx, comm, bufs[static_cast<size_t>(i)], "registrations"));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (i == 0) {
      std::map<std::string, long> after = mrsPerDevice();
      for (const auto& kv : after) {
        if (kv.second > before[kv.first]) ++f.devices;
      }
    }
  }
  for (void* mh : mhs) deregHost(ctx, comm, mh, "registrations");
  f.medianUs = median(us);
  return f;
}

// "256K", "4M", "1G" (the sizes as given), for figure names without spaces.
std::string sizeLabel(size_t size) {
  if (size % (1u << 30) == 0) return std::to_string(size >> 30) + "G";
  if (size % (1u << 20) == 0) return std::to_string(size >> 20) + "M";
  if (size % (1u << 10) == 0) return std::to_string(size >> 10) + "K";
  return std::to_string(size);
}

}  // namespace

std::string runRegistrations(Context& ctx) {
  requireNodes(ctx, 0);
  int count = static_cast<int>(ctx.opts.integer("count", 5));
  std::vector<size_t> sizes;
  {
    std::string list = ctx.opts.str("sizes", "256K,4M,64M");
    std::istringstream in(list);
    std::string item;
    while (std::getline(in, item, ',')) {
      size_t s = 0;
      if (!parseSize(item, &s) || s == 0) fail("--sizes: bad size '%s'", item.c_str());
      sizes.push_back(s);
    }
  }
  EstablishSpec spec;
  spec.tag = "registrations";
  if (ctx.rank == 0) spec.connectTo = {1};
  if (ctx.rank == 1) spec.acceptFrom = {0};
  CommTable t = establish(ctx, spec, ctx.deadline);
  std::string figures;
  if (ctx.rank == 0) {
    void* comm = t.at(1).send[0];
    size_t towards = labDevicesTowards(1).size();
    size_t all = mrsPerDevice().size();
    for (size_t size : sizes) {
      Figures viaComm = measure(ctx, comm, size, count);
      Figures everywhere = measure(ctx, nullptr, size, count);
      std::string h = sizeLabel(size);
      figures += format(" regs_comm_%s=%d regs_all_%s=%d pinned_MiB_comm_%s=%.2f pinned_MiB_all_%s=%.2f "
                        "us_comm_%s=%.0f us_all_%s=%.0f",
                        h.c_str(), viaComm.devices, h.c_str(), everywhere.devices, h.c_str(),
                        static_cast<double>(size) * viaComm.devices / 1048576.0, h.c_str(),
                        static_cast<double>(size) * everywhere.devices / 1048576.0, h.c_str(), viaComm.medianUs,
                        h.c_str(), everywhere.medianUs);
      if (viaComm.devices != static_cast<int>(towards) || everywhere.devices != static_cast<int>(all) ||
          viaComm.devices >= everywhere.devices) {
        fail("registrations: %s through the comm to rank 1 registered on %d device(s), expected the %zu towards it; "
             "through no comm on %d, expected all %zu",
             h.c_str(), viaComm.devices, towards, everywhere.devices, all);
      }
    }
    figures = format("devices=%zu towards_rank1=%zu", all, towards) + figures;
  }
  ctx.barrier("registrations-done");
  closeAll(ctx, t);
  return figures;
}

}  // namespace e2e
