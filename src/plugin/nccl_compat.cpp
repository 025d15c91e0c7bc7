// SPDX-License-Identifier: Apache-2.0
// Sources, at the tags named: the ABI search orders are NCCL's src/net.cc ncclNetPluginInit
// (2.20.3-1 .. 2.25.1-1) and src/plugin/net.cc ncclNetVersion[] (2.26.2-1 .. 2.30.7-1); the
// absolute plugin path is openNetPluginLib (2.21.5-1 src/net.cc); run-time connect is
// NCCL_RUNTIME_CONNECT (2.22.3-1 src/init.cc); NCCL_NET_PLUGIN lists are
// initPluginLibsOnceFunc (2.27.3-1 src/plugin/net.cc); the reload that forgets the plugin's
// name is ncclNetPluginUnload (2.27.3-1 .. 2.29.7-1 clear the entry; 2.30.3-1 keeps the name);
// the version code is NCCL_VERSION in src/nccl.h.in.
#include "mesh/plugin/nccl_compat.h"

#include "mesh/platform/text.h"

#include <cstdlib>

namespace mesh {

std::string NcclVersion::text() const {
  return known() ? strf("%d.%d.%d", major, minor, patch) : std::string("unknown");
}

NcclVersion decodeNcclVersionCode(int code) {
  NcclVersion v;
  if (code >= 10000) {
    v.major = code / 10000;
    v.minor = code % 10000 / 100;
    v.patch = code % 100;
  } else if (code >= 1000) {
    v.major = code / 1000;
    v.minor = code % 1000 / 100;
    v.patch = code % 100;
  }
  if (v.major < 2 || v.major > 9) return NcclVersion();
  return v;
}

std::vector<int> ncclAbiSearchOrder(const NcclVersion& v) {
  if (!v.known()) return {};
  if (v.atLeast(2, 30)) return {12, 11, 10, 9, 8, 7, 6};
  if (v.atLeast(2, 28)) return {11, 10, 9, 8, 7, 6};
  if (v.atLeast(2, 26)) return {10, 9, 8, 7, 6};
  if (v.atLeast(2, 24)) return {9, 8, 7, 6, 5};
  if (v.atLeast(2, 20)) return {8, 7, 6, 5};
  return {7, 6, 5};
}

int ncclAbiTaken(const NcclVersion& v) {
  for (int abi : ncclAbiSearchOrder(v)) {
    if (abi >= kMeshAbiOldest && abi <= kMeshAbiNewest) return abi;
  }
  return 0;
}

std::string ncclUnreadNote(const NcclVersion& v) {
  if (!v.known() || !v.atLeast(kNcclNewestReadMajor, kNcclNewestReadMinor + 1)) return "";
  return strf("NCCL %d.%d is newer than %d.%d, the newest release whose plugin loader this build was checked "
              "against: its ABI order is taken to be %d.%d's",
              v.major, v.minor, kNcclNewestReadMajor, kNcclNewestReadMinor, kNcclNewestReadMajor,
              kNcclNewestReadMinor);
}

std::string abiListText(const std::vector<int>& abis) {
  std::string out;
  for (int abi : abis) out += (out.empty() ? "v" : ", v") + std::to_string(abi);
  return out;
}

std::string ncclReleasesForAbi(int abi) {
  switch (abi) {
    case 8: return "2.20 - 2.23";
    case 9: return "2.24 - 2.25";
    case 10: return "2.26 - 2.27";
    case 11: return "2.28 - 2.29";
    case 12: return "2.30 or newer";
    default: return "an NCCL this plugin does not know";
  }
}

std::vector<NcclLack> ncclFeaturesLacking(const NcclVersion& v) {
  std::vector<NcclLack> out;
  if (!v.known()) return out;
  if (!v.atLeast(2, 20)) {
    out.push_back({"the ncclNet v8 ABI (2.20)", "it never loads nccl-mesh and uses its own transports"});
  }
  if (!v.atLeast(2, 21)) {
    out.push_back({"an absolute NCCL_NET_PLUGIN path (2.21)",
                   "use NCCL_NET_PLUGIN=mesh with the plugin's directory in LD_LIBRARY_PATH"});
  }
  if (!v.atLeast(2, 22)) {
    out.push_back({"run-time connect (2.22)",
                   "it connects every ring and tree at init, so a 4-node ring needs NCCL_MESH_RELAY=auto "
                   "even with NCCL_ALGO=Ring"});
  }
  if (!v.atLeast(2, 24)) {
    out.push_back({"ncclNet v9 (2.24)", "sends are limited to 1 GiB each (the v8 ABI's int sizes)"});
  }
  if (!v.atLeast(2, 27)) {
    out.push_back({"NCCL_NET_PLUGIN lists (2.27)", "NCCL_NET_PLUGIN must name one plugin"});
  }
  return out;
}

std::string describeLoader(const NcclVersion& fromGetVersion, const std::string& where, int abiEntered) {
  std::string abi = abiEntered > 0 ? "ncclNet v" + std::to_string(abiEntered) : std::string("an unknown ncclNet version");
  if (fromGetVersion.known()) {
    std::string text = "loaded by NCCL " + fromGetVersion.text() + " (ncclGetVersion" +
                       (where.empty() ? "" : " in " + where) + "), through " + abi;
    int expected = ncclAbiTaken(fromGetVersion);
    if (abiEntered > 0 && expected != 0 && expected != abiEntered) {
      text += strf(" (that NCCL itself takes v%d: a shim or another program entered through the older table)",
                   expected);
    }
    std::string unread = ncclUnreadNote(fromGetVersion);
    if (!unread.empty()) text += " (" + unread + ")";
    return text;
  }
  if (abiEntered <= 0) return "loaded by an unknown NCCL (no ncclGetVersion in the process; no ABI entry yet)";
  return "loaded through " + abi + ": NCCL " + ncclReleasesForAbi(abiEntered) +
         " (no ncclGetVersion visible in the process; that range is what takes v" + std::to_string(abiEntered) +
         " when v8 to v12 are offered)";
}

std::string ncclReloadAdvice(const NcclVersion& v, const char* refCountEnv) {
  if (!v.known() || !v.atLeast(2, 27) || v.atLeast(2, 30)) return "";
  if (refCountEnv != nullptr && std::atoi(refCountEnv) > 0) return "";
  return "NCCL " + v.text() +
         " forgets this plugin's name when it unloads it after the last communicator is destroyed: "
         "a communicator created after that in this process fails with 'Failed to initialize any NET "
         "plugin' (or, without NCCL_NET=Mesh, takes NCCL's own transport). A job that destroys and "
         "re-creates its process group should set NCCL_NET_PLUGIN_REF_COUNT=1 (fixed in NCCL 2.30)";
}

}  // namespace mesh
