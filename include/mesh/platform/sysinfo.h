// SPDX-License-Identifier: Apache-2.0
// What the kernel says about pinning memory: the locked-memory limit (/proc/self/limits,
// CAP_IPC_LOCK in /proc/self/status) and the CMA figures (/proc/meminfo), read as text under
// a root prefix so that tests can hand in a fake /proc. Used by the memory registration's
// error text (mr_cache.cpp) and by nccl-mesh-info --doctor. Parsers are pure.
// Why CMA: RDMA registration pins pages for the long term, and the kernel must first move
// them out of CMA pageblocks; a kernel that hands out pageblocks typed CMA beyond its CMA
// area (CmaFree above CmaTotal: Ubuntu's 7.0 kernels with Kexec HandOver on, DGX Spark
// reports 2026) fails ibv_reg_mr with ENOMEM once memory is tight.
#pragma once

#include <cstdint>
#include <string>

namespace mesh {

// The whole file (up to maxBytes) into *out. False with *error = "cannot read PATH: why".
bool readTextFile(const std::string& path, std::string* out, std::string* error,
                  size_t maxBytes = 1 << 20);

struct MemlockLimit {
  bool known = false;
  bool softUnlimited = false;
  bool hardUnlimited = false;
  uint64_t softBytes = 0;
  uint64_t hardBytes = 0;
};

struct CmaFigures {
  bool known = false;  // both fields found
  uint64_t totalKb = 0;
  uint64_t freeKb = 0;
  // Pageblocks typed CMA that the CMA area does not account for: what makes long-term
  // pinning fail under memory pressure.
  bool anomalous() const { return known && freeKb > totalKb; }
};

// "Max locked memory  8388608  8388608  bytes" (or "unlimited") from /proc/<pid>/limits.
// False when the line is missing or malformed.
bool parseMemlockLimit(const std::string& limitsText, MemlockLimit* out);
// A "Key:  123 kB" field of /proc/meminfo. False when absent or malformed.
bool parseMeminfoKb(const std::string& meminfoText, const std::string& key, uint64_t* kb);
bool parseCma(const std::string& meminfoText, CmaFigures* out);
// CAP_IPC_LOCK (bit 14) in the CapEff line of /proc/<pid>/status; false if absent.
bool parseCapIpcLock(const std::string& statusText, bool* has);

// "unlimited", "64 KiB", "8 MiB", "2.5 GiB"
std::string bytesText(uint64_t bytes, bool unlimited = false);

// What to tell a user whose registration failed with ENOMEM/EPERM/EFAULT: the limit, the
// CMA figures and the fix, starting with "; ". Pure.
std::string pinningAdvice(const MemlockLimit& limit, const CmaFigures& cma);
// The same, read from this process's /proc and getrlimit().
std::string pinningAdviceForThisProcess();

}  // namespace mesh
