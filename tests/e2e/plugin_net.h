// SPDX-License-Identifier: Apache-2.0
// The plugin as NCCL sees it: dlopen("libnccl-net-mesh.so", RTLD_NOW | RTLD_LOCAL) through
// LD_LIBRARY_PATH, dlsym("ncclNetPlugin_v<8..12>") (--api), init with a capturing
// logger. Every call goes through netapi::NetApi (tests/abi_versions/net_api.h), so the
// scenarios read the same whatever the version: sizes are size_t, v11's context is
// created by load() and ended by unload(). Nothing here links the plugin's code.
// Owns: the library handle, the bound table and the captured log (every line the plugin
// sends to NCCL's logger, from any thread). Parses the plugin's per-connection INFO lines:
//   NET/Mesh : conn <send|recv> peer=<ipv4> link=<k> local=<dev>:<port>/<netdev>
//              addr=<ipv4> gid_index=<n> qpn=<n> mtu=<bytes>   (extra fields tolerated)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "net_api.h"

namespace e2e {

struct LogLine {
  ncclDebugLogLevel level;
  double at;  // seconds since the plugin was loaded
  std::string text;
};

struct ConnLine {
  std::string dir;      // "send" or "recv"
  std::string peer;     // peer's IPv4 address
  int link = -1;
  std::string dev;      // local RDMA device, e.g. rxe_p1
  int port = 0;
  std::string netdev;   // local netdev, e.g. p1
  std::string addr;     // local IPv4 address
  int gidIndex = -1;
  int qpn = -1;
  int mtu = 0;
  std::string ece;     // "0x<vendor>:0x<options>" when the link's QPs use ECE, else ""
  std::string raw;
};

// Parses one captured log text; false when it is not a conn line.
bool parseConnLine(const std::string& text, ConnLine* out);

// The lab's addressing plan: link L between nodes i<j is 198.18.L.0/24 with node n at
// .(n+1). Returns the node owning `ipv4`, or -1 outside 198.18.0.0/16.
int labNodeOf(const std::string& ipv4);
// Third octet of a 198.18.L.x address (the lab link index), or -1.
int labLinkOf(const std::string& ipv4);
// True when `netdev` is the lab's name for a NIC cabled to `peer`: p<peer>, p<peer>b, ...
bool isNetdevTowards(const std::string& netdev, int peer);

const char* resultName(int result);

class PluginNet {
 public:
  // Loads `path` (a bare name is searched in LD_LIBRARY_PATH, as NCCL does), resolves
  // ncclNetPlugin_v<version> and calls init with the capturing logger and `trafficClass`
  // (reaches the plugin in v10, v11 and v12 only; -1 = unset). Throws Failure.
  void load(const std::string& path, int version, int trafficClass, bool echoInfo);
  // The reference instead of the plugin: NCCL's own IB transport out of `lib` (nccl_ib.h;
  // "" = libnccl.so.2), in a private /sys/class with the verbs library's devices, bound as
  // v11 and initialised like the plugin. unload() finalizes it but keeps the library open.
  void loadNcclIb(const std::string& lib, int trafficClass, bool echoInfo);
  // The same as a second transport beside the loaded one (coll-bench --vs nccl-ib): every call
  // goes to the current one, use(0) the first, use(1) the reference; unload() ends both.
  void addNcclIb(const std::string& lib, int trafficClass);
  void use(int slot);
  bool hasSecond() const { return libs_[1] != nullptr; }
  // The current transport is NCCL's IB transport (the reference), not the plugin: checks of
  // the plugin's own log lines do not apply to it.
  bool isNcclIb() const { return ncclIb_[cur_]; }
  // finalize (v11/v12: ends init's context), then dlclose; checks nothing outlives the
  // library (the caller's process keeps running).
  void unload();
  const netapi::NetApi& api() const { return apis_[cur_]; }
  netapi::NetApi* operator->() { return &apis_[cur_]; }

  // Throws Failure "<what> returned <name> (<n>): <context>; plugin's last WARN: ..."
  // unless r == ncclSuccess.
  void check(ncclResult_t r, const char* what, const std::string& context) const;

  // --- the captured log ---
  size_t logSize() const;
  std::vector<LogLine> logSince(size_t mark) const;
  std::vector<ConnLine> connLines(size_t since = 0) const;
  // First WARN at or after `since` containing `needle`; empty if none.
  std::string findWarn(const std::string& needle, size_t since) const;
  std::string lastWarn() const;
  // Prints the last `n` captured lines (any level) to stdout.
  void dumpTail(size_t n) const;

 private:
  // Slot 0: what load()/loadNcclIb() loaded; slot 1: addNcclIb's reference.
  void openNcclIbInto(int slot, const std::string& lib, int trafficClass);
  void* libs_[2] = {nullptr, nullptr};
  bool ncclIb_[2] = {false, false};
  netapi::NetApi apis_[2];
  int cur_ = 0;
};

}  // namespace e2e
