// SPDX-License-Identifier: Apache-2.0
// The settings table. Every setting is one row (name, default, doc, accepted values,
// parse, format), so loading, the init log line, --help and the README cannot drift
// apart. A row's parse leaves Config untouched when it rejects a value, which is what
// makes "bad value → default" hold without a second copy of the defaults.
#include "mesh/config/config.h"
#include "mesh/platform/text.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <charconv>
#include <climits>
#include <utility>

namespace mesh {

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;

struct Setting {
  SettingInfo info;
  std::string accepted;  // shown in warnings after "accepted: "
  std::function<bool(const std::string& text, Config* config)> parse;
  std::function<std::string(const Config& config)> format;
  // Optional: why `text` was refused, where the accepted values alone do not say (which
  // entry of a list is wrong, a value that exists but is not available yet).
  std::function<std::string(const std::string& text)> explain = nullptr;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Whole-string integer: "12abc", "+3", "" and overflow are all rejected.
bool parseInt(const std::string& text, long long* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Bytes, with an optional binary K/M/G suffix ("64K" = 65536).
bool parseSize(const std::string& text, uint64_t* out) {
  std::string digits = text;
  uint64_t unit = 1;
  switch (text.empty() ? '\0' : std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K':
      unit = kKiB;
      break;
    case 'M':
      unit = kMiB;
      break;
    case 'G':
      unit = kGiB;
      break;
    default:
      break;
  }
  if (unit != 1) digits.pop_back();
  uint64_t value = 0;
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (ec != std::errc() || ptr != end || digits.empty()) return false;
  if (value > UINT64_MAX / unit) return false;
  *out = value * unit;
  return true;
}

std::string formatSize(uint64_t value) {
  if (value != 0 && value % kGiB == 0) return std::to_string(value / kGiB) + "G";
  if (value != 0 && value % kMiB == 0) return std::to_string(value / kMiB) + "M";
  if (value != 0 && value % kKiB == 0) return std::to_string(value / kKiB) + "K";
  return std::to_string(value);
}

bool parseBool(const std::string& text, bool* out) {
  std::string t = lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") {
    *out = true;
  } else if (t == "0" || t == "false" || t == "no" || t == "off") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

Setting stringSetting(const char* name, const char* def, const char* doc,
                      std::string Config::*field) {
  return {{name, def, doc},
          "any text",
          [field](const std::string& text, Config* c) {
            c->*field = text;
            return true;
          },
          [field](const Config& c) { return c.*field; }};
}

Setting intSetting(const char* name, const char* def, const char* doc, int Config::*field,
                   long long lo, long long hi) {
  std::string accepted = hi == INT_MAX
                             ? "an integer >= " + std::to_string(lo)
                             : "an integer " + std::to_string(lo) + ".." + std::to_string(hi);
  return {{name, def, doc},
          accepted,
          [field, lo, hi](const std::string& text, Config* c) {
            long long v = 0;
            if (!parseInt(text, &v) || v < lo || v > hi) return false;
            c->*field = static_cast<int>(v);
            return true;
          },
          [field](const Config& c) { return std::to_string(c.*field); }};
}

Setting sizeSetting(const char* name, const char* def, const char* doc, size_t Config::*field,
                    uint64_t lo, uint64_t hi) {
  return {{name, def, doc},
          "bytes " + formatSize(lo) + ".." + formatSize(hi) + ", with an optional K, M or G suffix",
          [field, lo, hi](const std::string& text, Config* c) {
            uint64_t v = 0;
            if (!parseSize(text, &v) || v < lo || v > hi) return false;
            c->*field = static_cast<size_t>(v);
            return true;
          },
          [field](const Config& c) { return formatSize(c.*field); }};
}

Setting boolSetting(const char* name, const char* def, const char* doc, bool Config::*field) {
  return {{name, def, doc},
          "0/1, true/false, yes/no, on/off",
          [field](const std::string& text, Config* c) { return parseBool(text, &(c->*field)); },
          [field](const Config& c) { return std::string(c.*field ? "1" : "0"); }};
}

// One of NCCL's own variables, which NCCL reads too: read as NCCL's ncclLoadParam does
// (strtoll, base 0: "2", "0x1" and "-1" are nonzero; what follows the number is ignored), so
// both agree. Text with no number NCCL reads as 0, which is also what the WARN falls back to.
Setting ncclFlagSetting(const char* name, const char* def, const char* doc, bool Config::*field) {
  return {{name, def, doc},
          "a number, as NCCL reads it: 0 = off, any other = on",
          [field](const std::string& text, Config* c) {
            errno = 0;
            char* end = nullptr;
            long long v = strtoll(text.c_str(), &end, 0);
            if (end == text.c_str() || errno != 0) return false;
            c->*field = v != 0;
            return true;
          },
          [field](const Config& c) { return std::string(c.*field ? "1" : "0"); }};
}

Setting devicesSetting() {
  return {
      {"NCCL_MESH_DEVICES", "node",
       "What NCCL sees as one network device: 'node' = one device per node whose "
       "connections are routed over the port(s) cabled to each peer; 'port' = one "
       "device per RDMA port"},
      "node, port",
      [](const std::string& text, Config* c) {
        std::string t = lower(text);
        if (t != "node" && t != "port") return false;
        c->devices = t == "node" ? DeviceMode::Node : DeviceMode::Port;
        return true;
      },
      [](const Config& c) { return std::string(c.devices == DeviceMode::Node ? "node" : "port"); }};
}

Setting mtuSetting() {
  return {{"NCCL_MESH_IB_MTU", "0",
           "RoCE path MTU in bytes (256, 512, 1024, 2048 or 4096); 0 = the smaller of the "
           "two ports' active MTUs"},
          "0, 256, 512, 1024, 2048, 4096",
          [](const std::string& text, Config* c) {
            long long v = 0;
            if (!parseInt(text, &v)) return false;
            if (v != 0 && v != 256 && v != 512 && v != 1024 && v != 2048 && v != 4096) {
              return false;
            }
            c->mtu = static_cast<int>(v);
            return true;
          },
          [](const Config& c) { return std::to_string(c.mtu); }};
}

Setting listenAddrSetting() {
  return {{"NCCL_MESH_LISTEN_ADDR", "",
           "Where the handshake listener binds: empty = only this node's mesh addresses; "
           "'any' = every interface (0.0.0.0)"},
          "any, or empty for the mesh addresses",
          [](const std::string& text, Config* c) {
            if (lower(text) != "any") return false;
            c->listenAddr = "any";
            return true;
          },
          [](const Config& c) { return c.listenAddr; }};
}

bool parsePortRange(const std::string& text, int* lo, int* hi) {
  size_t dash = text.find('-');
  if (dash == std::string::npos) return false;
  long long a = 0;
  long long b = 0;
  if (!parseInt(trim(text.substr(0, dash)), &a) || !parseInt(trim(text.substr(dash + 1)), &b)) {
    return false;
  }
  if (a < 1 || b > 65535 || a > b) return false;
  *lo = static_cast<int>(a);
  *hi = static_cast<int>(b);
  return true;
}

Setting portRangeSetting() {
  return {{"NCCL_MESH_PORT_RANGE", "",
           "TCP port range 'lo-hi' for the handshake listeners (NCCL's listen comms and the relay's leg "
           "listeners), e.g. to match a firewall rule; empty = an ephemeral port"},
          "lo-hi with 1 <= lo <= hi <= 65535",
          [](const std::string& text, Config* c) {
            return parsePortRange(text, &c->portMin, &c->portMax);
          },
          [](const Config& c) {
            if (c.portMin == 0 && c.portMax == 0) return std::string();
            return std::to_string(c.portMin) + "-" + std::to_string(c.portMax);
          }};
}

Setting relaySetting() {
  return {{"NCCL_MESH_RELAY", "off",
           "Relay: 'auto' = a pair of nodes without a shared cable connects through a "
           "neighbour cabled to both (its plugin process forwards; set it on every node); "
           "'off' = such a pair gets the routing error"},
          "off|auto",
          [](const std::string& text, Config* c) {
            std::string v = lower(text);
            if (v != "off" && v != "auto") return false;
            c->relay = v == "auto" ? RelayMode::Auto : RelayMode::Off;
            return true;
          },
          [](const Config& c) { return std::string(c.relay == RelayMode::Off ? "off" : "auto"); },
          [](const std::string&) { return std::string(); }};
}

Setting staticRoutesSetting() {
  return {{"NCCL_MESH_ROUTES", "",
           "Relay: static routes, 'DEST/LEN=NEXTHOP' entries separated by ',' "
           "or ';' (e.g. '198.18.2.0/24=198.18.0.2'): reach DEST through the neighbour at "
           "NEXTHOP; they override learned routes to the same prefix; empty = none"},
          "DEST/LEN=NEXTHOP entries separated by ',' or ';'",
          [](const std::string& text, Config* c) {
            std::string ignored;
            return parseStaticRoutes(text, &c->staticRoutes, &ignored);
          },
          [](const Config& c) { return formatStaticRoutes(c.staticRoutes); },
          [](const std::string& text) {
            std::vector<StaticRoute> ignored;
            std::string why;
            parseStaticRoutes(text, &ignored, &why);
            return why;
          }};
}

std::vector<Setting> buildTable() {
  // Rows are in Config's field order; describeConfig and the README follow it.
  return {
      stringSetting("NCCL_MESH_IBVERBS_LIB", "libibverbs.so.1",
                    "The rdma-core verbs library to dlopen (soname or path), for a "
                    "non-default rdma-core install",
                    &Config::ibverbsLib),
      stringSetting("NCCL_MESH_CUDA_LIB", "libcuda.so.1",
                    "The CUDA driver library asked whether the GPUs support GPUDirect RDMA "
                    "and DMA-BUF (soname or path); where none does (DGX Spark's GB10) the "
                    "plugin offers host memory only; a library that does not load leaves "
                    "the NIC's answer",
                    &Config::cudaLib),
      stringSetting("NCCL_MESH_HCA", "",
                    "RDMA devices/ports to use, in NCCL_IB_HCA syntax: prefix match, "
                    "'=' exact names, '^' exclude, 'dev:port' one port (e.g. "
                    "'^=mlx5_2:1'; 'dev:' every port; NCCL 2.30's 'dev:port:rail:plane' is "
                    "read, rail and plane ignored); a malformed entry (WARN) selects nothing, "
                    "so a list of only such entries selects no port; empty = every ACTIVE "
                    "RoCEv2 port",
                    &Config::hca),
      devicesSetting(),
      intSetting("NCCL_MESH_SPEED", "0",
                 "Link speed reported to NCCL, in Mbps; 0 = the port's own speed, read as "
                 "NCCL's IB transport reads it (`ibv_query_port_speed` on rdma-core 62+, "
                 "else `active_speed_ex` on 49+, else `active_speed`, times the width; "
                 "`nccl-mesh-info` shows it per port). Set it when a driver such as rxe "
                 "reports a wrong one",
                 &Config::speedMbps, 0, INT_MAX),
      intSetting("NCCL_MESH_GID_INDEX", "-1",
                 "RoCE GID index used on every port, as NCCL_IB_GID_INDEX; -1 = the RoCEv2 "
                 "GID of the IPv4 address each route uses",
                 &Config::gidIndex, -1, 255),
      intSetting("NCCL_MESH_CONNECT_TIMEOUT_MS", "30000",
                 "How long a connection may wait for the peer's handshake before it "
                 "fails, in milliseconds (100..3600000); a relayed one (no cable to the peer) "
                 "ends at twice this, whatever relays it tried",
                 &Config::connectTimeoutMs, 100, 3600000),
      intSetting("NCCL_MESH_ACCEPT_WAIT_MS", "1800000",
                 "How long a connect waits for the peer to call accept while the peer is "
                 "there, in milliseconds (0..86400000; below NCCL_MESH_CONNECT_TIMEOUT_MS "
                 "counts as that). NCCL exchanges every peer's handle before it connects or "
                 "accepts, so a rank's accept can come late while it waits for a slower "
                 "rank; NCCL's IB transport waits without a limit. A peer whose host or "
                 "link goes away meanwhile fails the connect after NCCL_MESH_PEER_TIMEOUT_MS "
                 "(TCP keepalive; with 0 there only this bounds the wait). Relayed connects end "
                 "at twice NCCL_MESH_CONNECT_TIMEOUT_MS",
                 &Config::acceptWaitMs, 0, 86400000),
      intSetting("NCCL_MESH_PEER_TIMEOUT_MS", "30000",
                 "How long an established connection's peer may stay silent (no heartbeat "
                 "from its plugin, sent every quarter of this, nor TCP keepalive answer: "
                 "process stopped or hung, host down, link down) before its comms fail, in "
                 "milliseconds (0..3600000; 0 = never; below 1000 counts as 1000)",
                 &Config::peerTimeoutMs, 0, 3600000),
      intSetting("NCCL_MESH_IB_TIMEOUT", "20",
                 "QP ACK timeout exponent: 4.096 us * 2^n (1..31), as NCCL_IB_TIMEOUT",
                 &Config::ibTimeout, 1, 31),
      intSetting("NCCL_MESH_IB_RETRY_CNT", "7",
                 "QP retransmission count on ACK timeout (0..7), as NCCL_IB_RETRY_CNT",
                 &Config::ibRetryCnt, 0, 7),
      intSetting("NCCL_MESH_IB_RNR_RETRY", "7",
                 "QP receiver-not-ready retry count (0..7; 7 = retry forever)", &Config::ibRnrRetry,
                 0, 7),
      intSetting("NCCL_MESH_IB_TC", "-1",
                 "IP traffic class byte of RoCEv2 packets, DSCP in its upper 6 bits "
                 "(0..255), as NCCL_IB_TC: when set it wins over the communicator's trafficClass "
                 "(ncclNet v10+); -1 = the communicator's, else 0. The connecting side decides "
                 "for both ends",
                 &Config::trafficClass, -1, 255),
      intSetting("NCCL_MESH_IB_FIFO_TC", "-1",
                 "Traffic class (0..255) of the receiving side's QPs, which carry its credits (the "
                 "FIFO entries it writes into the sender) and its ACKs, as NCCL_IB_FIFO_TC: a separate "
                 "class lets RoCE QoS give the small control writes priority over data; each receiving "
                 "node decides for itself; -1 = the connection's class",
                 &Config::fifoTrafficClass, -1, 255),
      intSetting("NCCL_MESH_IB_SL", "0",
                 "Service level (0..7), as NCCL_IB_SL: on RoCE the packets' 802.1p priority, of "
                 "which ConnectX takes only 3 bits (8..15 would land in 0..7 unannounced)",
                 &Config::serviceLevel, 0, 7),
      boolSetting("NCCL_MESH_IB_ECE_ENABLE", "1",
                  "1 = negotiate Enhanced Connection Establishment options (ibv_query_ece / ibv_set_ece, "
                  "rdma-core 31+; mlx5 agrees on features such as selective repeat this way) for every QP, "
                  "as NCCL_IB_ECE_ENABLE; providers without ECE (rxe) connect without. The connecting node "
                  "decides; 0 = never",
                  &Config::ibEce),
      mtuSetting(),
      intSetting("NCCL_MESH_QPS_PER_CONN", "1",
                 "RC QPs per connection and link, as NCCL_IB_QPS_PER_CONNECTION; large "
                 "messages are striped over them (1..16)",
                 &Config::qpsPerConn, 1, 16),
      sizeSetting("NCCL_MESH_SPLIT_MIN", "64K",
                  "Messages smaller than this are not split across QPs and parallel "
                  "links (bytes, K/M/G suffixes, 0..1G)",
                  &Config::splitMin, 0, kGiB),
      sizeSetting("NCCL_MESH_CHUNK_SIZE", "1G",
                  "Largest RDMA write posted as one work request; larger transfers are "
                  "posted in pieces (bytes, K/M/G suffixes, 4K..1G)",
                  &Config::chunkSize, 4 * kKiB, kGiB),
      listenAddrSetting(),
      portRangeSetting(),
      ncclFlagSetting("NCCL_GDR_FLUSH_DISABLE", "0",
                      "1 (any nonzero number, read as NCCL reads it) = skip the GPUDirect RDMA flush (a "
                      "1-byte loopback RDMA READ) after receives into GPU memory, as in NCCL's IB transport",
                      &Config::gdrFlushDisable),
      intSetting("NCCL_MESH_PCI_RELAXED_ORDERING", "2",
                 "PCIe relaxed ordering for the NIC's writes into NCCL's buffers (registered with "
                 "IBV_ACCESS_RELAXED_ORDERING), as NCCL_IB_PCI_RELAXED_ORDERING: 0 = off; 1 or 2 = on where "
                 "rdma-core has ibv_reg_mr_iova2 (1.8+). The plugin's own control memory never uses it",
                 &Config::relaxedOrdering, 0, 2),
      boolSetting("NCCL_MESH_FORCE_FLUSH", "0",
                  "1 = `iflush` also flushes (the loopback RDMA READ) receives into host memory, "
                  "not only GPU memory. For tests of the flush path: NCCL calls `iflush` only for GPU "
                  "buffers it received into with GPUDirect, so under NCCL it changes nothing",
                  &Config::forceFlush),
      relaySetting(),
      staticRoutesSetting(),
      intSetting("NCCL_MESH_RELAY_PORT", "41517",
                 "Relay: TCP port of the relay service on the mesh addresses, and UDP port "
                 "of its route HELLOs; the same on every node (1..65535)",
                 &Config::relayPort, 1, 65535),
      intSetting("NCCL_MESH_RELAY_MAX_HOPS", "2",
                 "Relay: most relay nodes on one path (1..15); a 6-node ring "
                 "needs 2, an 8-node ring 3",
                 &Config::relayMaxHops, 1, kRouteMaxHopsLimit),
      boolSetting("NCCL_MESH_RELAY_PLAN", "1",
                  "Relay: 1 = relayed pairs follow the cluster's route plan (every node computes the "
                  "same one) while every node's view of the cabling agrees; 0 = each connect picks "
                  "by the fallback rule (fewest relays, the process's least used port, node id)",
                  &Config::relayPlan),
      boolSetting("NCCL_MESH_RELAY_TWIN", "1",
                  "Relay: 1 = a pair with two equally short ways through different relays (a 4-ring's "
                  "opposite nodes) connects over both, each send going the way whose first cable carries "
                  "clearly less direct traffic, else the route plan's way (NCCL's tree gains: docs/relay.md); "
                  "0 = one relay per connection",
                  &Config::relayTwin),
      sizeSetting("NCCL_MESH_RELAY_CHUNK", "128K",
                  "Relay: bytes per slot of a relayed connection's staging ring "
                  "at the relay node, the piece it forwards as soon as it arrived (a quarter of NCCL's "
                  "512K step: docs/relay.md; K/M/G suffixes, 4K..64M)",
                  &Config::relayChunk, 4 * kKiB, 64 * kMiB),
      intSetting("NCCL_MESH_RELAY_DEPTH", "32",
                 "Relay: slots in a relayed connection's staging ring (2..64)",
                 &Config::relayDepth, 2, 64),
      sizeSetting("NCCL_MESH_RELAY_MEM", "1G",
                  "Relay: registered staging memory one relay node gives all "
                  "relayed connections together; beyond it a relayed connect is refused (K/M/G "
                  "suffixes, 1M..64G)",
                  &Config::relayMem, kMiB, 64 * kGiB),
      boolSetting("NCCL_MESH_STATS", "1",
                  "Publish live traffic counters (per cable, PCIe function, peer, relay) for "
                  "nccl-mesh-info --watch/--json/--prometheus on this node; 0 = off",
                  &Config::stats),
      stringSetting("NCCL_MESH_STATS_DIR", "",
                    "Directory of the live counters' files (one per process, mode 0600); empty = "
                    "/dev/shm/nccl-mesh-<uid>. Readers must use the same (--stats-dir)",
                    &Config::statsDir),
      stringSetting("NCCL_MESH_TRACE", "",
                    "Record every ncclNet call NCCL makes (arguments, results, never the data) into "
                    "PREFIX.HOST.PID.trace, for bug reports and tests/replay's mesh_replay; "
                    "empty = off",
                    &Config::tracePath),
      sizeSetting("NCCL_MESH_TRACE_MAX", "64M",
                  "Largest trace file; at the cap one WARN and the recording stops (K/M/G "
                  "suffixes, 64K..16G)",
                  &Config::traceMax, 64 * kKiB, 16 * kGiB),
  };
}

const std::vector<Setting>& table() {
  static const std::vector<Setting> kTable = buildTable();
  return kTable;
}

}  // namespace

Config loadConfig(const EnvLookup& env, std::vector<std::string>* warnings) {
  Config config;
  if (!env) return config;
  static const Config kDefaults;
  for (const Setting& s : table()) {
    const char* raw = env(s.info.name);
    if (raw == nullptr) continue;
    std::string text = trim(raw);
    if (text.empty()) continue;  // set-but-empty is how scripts "unset" a variable
    if (s.parse(text, &config)) continue;
    if (warnings) {
      std::string def = s.format(kDefaults);
      std::string why = s.explain ? s.explain(text) : std::string();
      // The value echoed is capped (a long NCCL_MESH_ROUTES): NCCL cuts a log line at 1023
      // bytes, which took the accepted values and the fallback with it.
      warnings->push_back(std::string(s.info.name) + "='" + shortened(raw, 160) + "' is not valid (accepted: " +
                          s.accepted + ")" + (why.empty() ? "" : ": " + why) + "; using " +
                          (def.empty() ? std::string("the default (empty)") : def));
    }
  }
  uint64_t ring = uint64_t{config.relayChunk} * static_cast<uint64_t>(config.relayDepth);
  if (warnings && ring > config.relayMem) {
    warnings->push_back("NCCL_MESH_RELAY_MEM=" + formatSize(config.relayMem) +
                        " is smaller than one relayed connection's staging ring "
                        "(NCCL_MESH_RELAY_CHUNK x NCCL_MESH_RELAY_DEPTH = " + formatSize(ring) +
                        "): every relayed connection would be refused; raise NCCL_MESH_RELAY_MEM "
                        "or lower the other two");
  }
  return config;
}

std::vector<std::string> describeConfig(const Config& config) {
  std::vector<std::string> lines;
  lines.reserve(table().size());
  for (const Setting& s : table()) {
    lines.push_back(std::string(s.info.name) + "=" + s.format(config));
  }
  return lines;
}

std::string shortened(const std::string& raw, size_t maxLen) {
  if (raw.size() <= maxLen) return raw;
  std::string tail = "... (" + std::to_string(raw.size()) + " characters)";
  return raw.substr(0, maxLen > tail.size() ? maxLen - tail.size() : 0) + tail;
}

std::vector<std::string> packLines(const std::vector<std::string>& items, size_t maxLen) {
  std::vector<std::string> lines;
  std::string line;
  for (const std::string& item : items) {
    std::string piece = " " + shortened(item, maxLen - 1);
    if (!line.empty() && line.size() + piece.size() > maxLen) {
      lines.push_back(line);
      line.clear();
    }
    line += piece;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

const std::vector<SettingInfo>& settingsTable() {
  static const std::vector<SettingInfo> kInfos = [] {
    std::vector<SettingInfo> infos;
    for (const Setting& s : table()) infos.push_back(s.info);
    return infos;
  }();
  return kInfos;
}

}  // namespace mesh
