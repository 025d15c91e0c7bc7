// SPDX-License-Identifier: Apache-2.0
// Settings: the one typed table of NCCL_MESH_* environment variables (plus the few NCCL_*
// variables NCCL's own IB transport honours that we honour too). Read once at init.
// A bad value gets a warning naming the variable and the accepted values, then the default.
// Pure code (the environment is passed in), unit-tested.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mesh/routing/routes.h"

namespace mesh {

enum class DeviceMode { Node, Port };

// NCCL_MESH_RELAY. Only Off can be set until the relay service and data path exist (issue
// 15): the settings refuse "auto", so no build enables a half-wired relay.
enum class RelayMode { Off, Auto };

struct Config {
  std::string ibverbsLib = "libibverbs.so.1";  // NCCL_MESH_IBVERBS_LIB
  std::string cudaLib = "libcuda.so.1";        // NCCL_MESH_CUDA_LIB
  std::string hca;                             // NCCL_MESH_HCA (NCCL_IB_HCA syntax)
  DeviceMode devices = DeviceMode::Node;       // NCCL_MESH_DEVICES = node | port
  int speedMbps = 0;                           // NCCL_MESH_SPEED, 0: from the port
  int gidIndex = -1;                           // NCCL_MESH_GID_INDEX, -1: per address
  int connectTimeoutMs = 30000;                // NCCL_MESH_CONNECT_TIMEOUT_MS
  int acceptWaitMs = 1800000;                  // NCCL_MESH_ACCEPT_WAIT_MS
  int peerTimeoutMs = 30000;                   // NCCL_MESH_PEER_TIMEOUT_MS
  int ibTimeout = 20;                          // NCCL_MESH_IB_TIMEOUT (4.096us * 2^n)
  int ibRetryCnt = 7;                          // NCCL_MESH_IB_RETRY_CNT
  int ibRnrRetry = 7;                          // NCCL_MESH_IB_RNR_RETRY (7 = infinite)
  int trafficClass = -1;                       // NCCL_MESH_IB_TC, -1: unset
  int fifoTrafficClass = -1;                   // NCCL_MESH_IB_FIFO_TC, -1: unset
  int serviceLevel = 0;                        // NCCL_MESH_IB_SL
  bool ibEce = true;                           // NCCL_MESH_IB_ECE_ENABLE
  int mtu = 0;                                 // NCCL_MESH_IB_MTU: 0 auto, else 256..4096
  int qpsPerConn = 1;                          // NCCL_MESH_QPS_PER_CONN (1..16)
  size_t splitMin = 65536;                     // NCCL_MESH_SPLIT_MIN bytes
  size_t chunkSize = 1u << 30;                 // NCCL_MESH_CHUNK_SIZE: max bytes per WR
  std::string listenAddr;                      // NCCL_MESH_LISTEN_ADDR: "" mesh addrs, "any"
  int portMin = 0;                             // NCCL_MESH_PORT_RANGE "lo-hi", 0: ephemeral
  int portMax = 0;
  bool gdrFlushDisable = false;                // NCCL_GDR_FLUSH_DISABLE
  bool forceFlush = false;                     // NCCL_MESH_FORCE_FLUSH: flush host memory too
  int relaxedOrdering = 2;                     // NCCL_MESH_PCI_RELAXED_ORDERING: 0 off, 1/2 when rdma-core can
  // Relay (issue 15): read and validated now, used once the relay service exists.
  RelayMode relay = RelayMode::Off;            // NCCL_MESH_RELAY: off (auto not available yet)
  std::vector<StaticRoute> staticRoutes;       // NCCL_MESH_ROUTES (routes.h syntax)
  int relayPort = 41517;                       // NCCL_MESH_RELAY_PORT, the same on every node
  int relayMaxHops = 2;                        // NCCL_MESH_RELAY_MAX_HOPS (relays on a path)
  bool relayPlan = true;                       // NCCL_MESH_RELAY_PLAN: follow the route plan
  bool relayTwin = true;                       // NCCL_MESH_RELAY_TWIN: two relays where two ways are as short
  size_t relayChunk = 128u << 10;              // NCCL_MESH_RELAY_CHUNK: staging ring slot
  int relayDepth = 32;                         // NCCL_MESH_RELAY_DEPTH: slots per connection
  size_t relayMem = size_t{1} << 30;           // NCCL_MESH_RELAY_MEM: staging cap per node
  // Live counters (mesh/stats/stats.h; nccl-mesh-info --watch reads them).
  bool stats = true;                           // NCCL_MESH_STATS
  std::string statsDir;                        // NCCL_MESH_STATS_DIR: "" = /dev/shm/nccl-mesh-<uid>
  // Recording every ncclNet call (src/abi/trace.h; tests/replay replays the files).
  std::string tracePath;                       // NCCL_MESH_TRACE: path prefix, "" = off
  size_t traceMax = size_t{64} << 20;          // NCCL_MESH_TRACE_MAX: bytes per file
};

// One row of the settings table, for logging, --help and the README.
struct SettingInfo {
  const char* name;
  const char* defaultText;
  const char* doc;
};

using EnvLookup = std::function<const char*(const char* name)>;

// Reads every setting through `env` (getenv in production). Each rejected value appends
// one human-readable warning to *warnings, e.g.
//   "NCCL_MESH_DEVICES='nodes' is not valid (accepted: node, port); using node",
// with the reason after the accepted values where a row can say more (a syntax error's
// entry, a value not available yet). Settings that contradict each other (the relay's
// staging ring larger than its memory cap) add a warning naming both and keep the values.
Config loadConfig(const EnvLookup& env, std::vector<std::string>* warnings);

// "NAME=value" for every setting, in table order (logged once at init).
std::vector<std::string> describeConfig(const Config& config);
// `items` joined by spaces into lines of at most `maxLen` characters, for log lines (NCCL's
// logger cuts a message at 1023 bytes, its own prefix included). An item longer than maxLen
// is cut, saying how long it was.
std::vector<std::string> packLines(const std::vector<std::string>& items, size_t maxLen);
// `raw` for an error message: at most `maxLen` characters of it, then how long it was.
std::string shortened(const std::string& raw, size_t maxLen);

// The table itself: name, default, one-line doc.
const std::vector<SettingInfo>& settingsTable();

}  // namespace mesh
