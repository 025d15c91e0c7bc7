// SPDX-License-Identifier: Apache-2.0
// What an NCCL release does with this plugin, as read from NCCL's source at the release tags
// (README "NCCL versions"): which ncclNet ABI versions it looks for, in order, the one it
// takes from us (we export v8 to v12), and the features a user may rely on that it lacks.
// Used by the plugin's init log line ("loaded by NCCL 2.28.9") and nccl-mesh-info --doctor.
// Pure code, unit-tested.
#pragma once

#include <string>
#include <vector>

namespace mesh {

constexpr int kMeshAbiOldest = 8;   // ncclNetPlugin_v8 ...
constexpr int kMeshAbiNewest = 12;  // ... to _v12 are exported

struct NcclVersion {
  int major = 0;
  int minor = 0;
  int patch = 0;
  bool known() const { return major > 0; }
  bool atLeast(int maj, int min) const { return major > maj || (major == maj && minor >= min); }
  std::string text() const;  // "2.28.9", or "unknown"
};

// ncclGetVersion()'s code: major*10000 + minor*100 + patch since 2.9, major*1000 +
// minor*100 + patch before. A code that decodes to nothing sensible gives an unknown version.
NcclVersion decodeNcclVersionCode(int code);

// The ABI versions NCCL `v` tries, first to last (NCCL 2.28: 11, 10, 9, 8, 7, 6). Releases newer
// than the last one read are assumed to try at least what it tries.
std::vector<int> ncclAbiSearchOrder(const NcclVersion& v);
// The ABI NCCL `v` takes from this plugin; 0 when it looks for none we export (< 2.20).
int ncclAbiTaken(const NcclVersion& v);
// The newest NCCL release whose plugin loader this build was read against (2.30.7-1). NCCL 2.31
// (v2.31.2-1, August 2026) and 2.32 (2.32.3 on PyPI, September 2026) exist; their sources were
// not available to read.
constexpr int kNcclNewestReadMajor = 2;
constexpr int kNcclNewestReadMinor = 30;
// For a release newer than that: "NCCL 2.32 is newer than 2.30, the newest release whose plugin
// loader this build was checked against: its ABI order is taken to be 2.30's". Empty otherwise.
std::string ncclUnreadNote(const NcclVersion& v);
// "v11, v10, v9, v8, v7, v6"
std::string abiListText(const std::vector<int>& abis);
// The NCCL releases that enter through `abi` when the plugin exports v8..v12: "2.28 - 2.29".
std::string ncclReleasesForAbi(int abi);

// What users of a mesh may need that `v` does not have, one phrase each ("an absolute
// NCCL_NET_PLUGIN path (2.21)"). Empty when nothing is missing.
struct NcclLack {
  std::string feature;   // what is missing and since when
  std::string impact;    // what it means here
};
std::vector<NcclLack> ncclFeaturesLacking(const NcclVersion& v);

// The init log line's text: "loaded by NCCL 2.28.9 (ncclGetVersion in <where>), through ncclNet
// v11" (plus ncclUnreadNote's words for a newer NCCL than the last read) or, when no
// ncclGetVersion was found, "loaded through ncclNet v11: NCCL 2.28 - 2.29".
std::string describeLoader(const NcclVersion& fromGetVersion, const std::string& where, int abiEntered);

// NCCL 2.27 to 2.29 unload an external net plugin when the last communicator using it is
// destroyed and clear its whole entry, name included (src/plugin/net.cc ncclNetPluginUnload;
// 2.30.3 keeps the name). A communicator created after that in the same process looks for
// libnccl-net.so instead: "Failed to initialize any NET plugin" under NCCL_NET=Mesh, or NCCL's
// own IB or socket transport without it. Seen with NCCL 2.28.9 (PyTorch 2.11) on the GPU
// machine. NCCL_NET_PLUGIN_REF_COUNT=1 keeps the plugin loaded, so its entry is never cleared.
// The advice for `v` with that variable's value (nullptr: unset); empty when not needed.
std::string ncclReloadAdvice(const NcclVersion& v, const char* refCountEnv);

}  // namespace mesh
