// SPDX-License-Identifier: Apache-2.0
#include "mesh/config/config.h"
#include "mesh/platform/log.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace mesh {
namespace {

// A fake environment: only the variables a test sets exist.
class FakeEnv {
 public:
  FakeEnv(std::initializer_list<std::pair<const std::string, std::string>> vars) : vars_(vars) {}
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

Config load(const FakeEnv& env, std::vector<std::string>* warnings) {
  return loadConfig(env.lookup(), warnings);
}

// Loads one variable and returns the single warning it produced ("" if none).
std::string warningFor(const std::string& name, const std::string& value, Config* out = nullptr) {
  FakeEnv env{{name, value}};
  std::vector<std::string> warnings;
  Config c = load(env, &warnings);
  if (out) *out = c;
  EXPECT_LE(warnings.size(), 1u);
  return warnings.empty() ? "" : warnings[0];
}

std::string describe(const Config& c, const std::string& name) {
  for (const std::string& line : describeConfig(c)) {
    if (line.compare(0, name.size() + 1, name + "=") == 0) return line.substr(name.size() + 1);
  }
  ADD_FAILURE() << name << " not in describeConfig";
  return "";
}

TEST(Config, UnsetEnvironmentGivesTheDefaultsWithoutWarnings) {
  std::vector<std::string> warnings;
  Config c = loadConfig([](const char*) -> const char* { return nullptr; }, &warnings);
  EXPECT_TRUE(warnings.empty());
  Config d;
  EXPECT_EQ(c.ibverbsLib, "libibverbs.so.1");
  EXPECT_EQ(c.devices, DeviceMode::Node);
  EXPECT_EQ(c.connectTimeoutMs, d.connectTimeoutMs);
  EXPECT_EQ(c.splitMin, 65536u);
  EXPECT_EQ(c.chunkSize, size_t{1} << 30);
  EXPECT_EQ(describeConfig(c), describeConfig(d));
}

TEST(Config, EmptyOrBlankVariablesMeanDefaultSilently) {
  FakeEnv env{{"NCCL_MESH_IB_TIMEOUT", ""},
              {"NCCL_MESH_DEVICES", "  "},
              {"NCCL_MESH_IBVERBS_LIB", ""},
              {"NCCL_MESH_PORT_RANGE", ""}};
  std::vector<std::string> warnings;
  Config c = load(env, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(c.ibTimeout, 20);
  EXPECT_EQ(c.ibverbsLib, "libibverbs.so.1");
}

TEST(Config, ReadsEveryVariableOfTheTable) {
  FakeEnv env{{"NCCL_MESH_IBVERBS_LIB", "/opt/rdma/lib/libibverbs.so.1"},
              {"NCCL_MESH_HCA", "^=rxe_p3:1"},
              {"NCCL_MESH_DEVICES", "PORT"},
              {"NCCL_MESH_SPEED", "100000"},
              {"NCCL_MESH_GID_INDEX", "3"},
              {"NCCL_MESH_CONNECT_TIMEOUT_MS", "5000"},
              {"NCCL_MESH_IB_TIMEOUT", "14"},
              {"NCCL_MESH_IB_RETRY_CNT", "3"},
              {"NCCL_MESH_IB_RNR_RETRY", "0"},
              {"NCCL_MESH_IB_TC", "106"},
              {"NCCL_MESH_IB_FIFO_TC", "184"},
              {"NCCL_MESH_IB_SL", "5"},
              {"NCCL_MESH_IB_ECE_ENABLE", "0"},
              {"NCCL_MESH_IB_MTU", "1024"},
              {"NCCL_MESH_QPS_PER_CONN", "4"},
              {"NCCL_MESH_SPLIT_MIN", "1M"},
              {"NCCL_MESH_CHUNK_SIZE", "256k"},
              {"NCCL_MESH_LISTEN_ADDR", "ANY"},
              {"NCCL_MESH_PORT_RANGE", "50000-50100"},
              {"NCCL_GDR_FLUSH_DISABLE", "0x1"},
              {"NCCL_MESH_FORCE_FLUSH", "on"},
              {"NCCL_MESH_RELAY", "OFF"},
              {"NCCL_MESH_ROUTES", "198.18.2.0/24=198.18.0.2"},
              {"NCCL_MESH_RELAY_PORT", "42000"},
              {"NCCL_MESH_RELAY_MAX_HOPS", "3"},
              {"NCCL_MESH_RELAY_PLAN", "0"},
              {"NCCL_MESH_RELAY_CHUNK", "1M"},
              {"NCCL_MESH_RELAY_DEPTH", "4"},
              {"NCCL_MESH_RELAY_MEM", "256M"}};
  std::vector<std::string> warnings;
  Config c = load(env, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(c.ibverbsLib, "/opt/rdma/lib/libibverbs.so.1");
  EXPECT_EQ(c.hca, "^=rxe_p3:1");
  EXPECT_EQ(c.devices, DeviceMode::Port);
  EXPECT_EQ(c.speedMbps, 100000);
  EXPECT_EQ(c.gidIndex, 3);
  EXPECT_EQ(c.connectTimeoutMs, 5000);
  EXPECT_EQ(c.ibTimeout, 14);
  EXPECT_EQ(c.ibRetryCnt, 3);
  EXPECT_EQ(c.ibRnrRetry, 0);
  EXPECT_EQ(c.trafficClass, 106);
  EXPECT_EQ(c.fifoTrafficClass, 184);
  EXPECT_EQ(c.serviceLevel, 5);
  EXPECT_FALSE(c.ibEce);
  EXPECT_EQ(c.mtu, 1024);
  EXPECT_EQ(c.qpsPerConn, 4);
  EXPECT_EQ(c.splitMin, 1u << 20);
  EXPECT_EQ(c.chunkSize, 256u << 10);
  EXPECT_EQ(c.listenAddr, "any");
  EXPECT_EQ(c.portMin, 50000);
  EXPECT_EQ(c.portMax, 50100);
  EXPECT_TRUE(c.gdrFlushDisable);
  EXPECT_TRUE(c.forceFlush);
  EXPECT_EQ(c.relay, RelayMode::Off);
  ASSERT_EQ(c.staticRoutes.size(), 1u);
  EXPECT_EQ(c.staticRoutes[0], (StaticRoute{{0xC6120200u, 24}, 0xC6120002u}));
  EXPECT_EQ(c.relayPort, 42000);
  EXPECT_EQ(c.relayMaxHops, 3);
  EXPECT_FALSE(c.relayPlan);
  EXPECT_EQ(c.relayChunk, 1u << 20);
  EXPECT_EQ(c.relayDepth, 4);
  EXPECT_EQ(c.relayMem, 256u << 20);
}

TEST(Config, BadEnumWarnsInTheDocumentedFormat) {
  Config c;
  EXPECT_EQ(warningFor("NCCL_MESH_DEVICES", "nodes", &c),
            "NCCL_MESH_DEVICES='nodes' is not valid (accepted: node, port); using node");
  EXPECT_EQ(c.devices, DeviceMode::Node);
  EXPECT_EQ(warningFor("NCCL_MESH_DEVICES", "Node", &c), "");
  EXPECT_EQ(warningFor("NCCL_MESH_DEVICES", " port ", &c), "");
  EXPECT_EQ(c.devices, DeviceMode::Port);
}

TEST(Config, IntegersRejectTrailingGarbageOverflowAndSigns) {
  for (const char* bad :
       {"12abc", "abc", "1.5", "+3", "0x10", "99999999999999999999999", "2 0", "--1"}) {
    Config c;
    std::string w = warningFor("NCCL_MESH_CONNECT_TIMEOUT_MS", bad, &c);
    EXPECT_EQ(w, std::string("NCCL_MESH_CONNECT_TIMEOUT_MS='") + bad +
                     "' is not valid (accepted: an integer 100..3600000); using 30000");
    EXPECT_EQ(c.connectTimeoutMs, 30000);
  }
}

TEST(Config, IntegersOutsideTheirRangeFallBackToTheDefault) {
  struct Case {
    const char* name;
    const char* low;
    const char* lowOk;
    const char* highOk;
    const char* high;
  };
  for (const Case& k : {Case{"NCCL_MESH_IB_TIMEOUT", "0", "1", "31", "32"},
                        Case{"NCCL_MESH_IB_RETRY_CNT", "-1", "0", "7", "8"},
                        Case{"NCCL_MESH_IB_RNR_RETRY", "-1", "0", "7", "8"},
                        Case{"NCCL_MESH_IB_TC", "-2", "-1", "255", "256"},
                        Case{"NCCL_MESH_IB_FIFO_TC", "-2", "-1", "255", "256"},
                        Case{"NCCL_MESH_IB_SL", "-1", "0", "7", "8"},
                        Case{"NCCL_MESH_QPS_PER_CONN", "0", "1", "16", "17"},
                        Case{"NCCL_MESH_CONNECT_TIMEOUT_MS", "99", "100", "3600000", "3600001"},
                        Case{"NCCL_MESH_PEER_TIMEOUT_MS", "-1", "0", "3600000", "3600001"},
                        Case{"NCCL_MESH_ACCEPT_WAIT_MS", "-1", "0", "86400000", "86400001"},
                        Case{"NCCL_MESH_GID_INDEX", "-2", "-1", "255", "256"},
                        Case{"NCCL_MESH_SPEED", "-1", "0", "2147483647", "2147483648"}}) {
    EXPECT_NE(warningFor(k.name, k.low), "") << k.name << "=" << k.low;
    EXPECT_NE(warningFor(k.name, k.high), "") << k.name << "=" << k.high;
    Config c;
    EXPECT_EQ(warningFor(k.name, k.lowOk, &c), "") << k.name;
    EXPECT_EQ(describe(c, k.name), k.lowOk);
    EXPECT_EQ(warningFor(k.name, k.highOk, &c), "") << k.name;
    EXPECT_EQ(describe(c, k.name), k.highOk);
  }
}

TEST(Config, RangeWarningNamesTheRange) {
  EXPECT_EQ(warningFor("NCCL_MESH_IB_TIMEOUT", "40"),
            "NCCL_MESH_IB_TIMEOUT='40' is not valid (accepted: an integer 1..31); using 20");
  EXPECT_EQ(warningFor("NCCL_MESH_SPEED", "-5"),
            "NCCL_MESH_SPEED='-5' is not valid (accepted: an integer >= 0); using 0");
}

TEST(Config, MtuAcceptsOnlyIbMtuSizes) {
  for (const char* ok : {"0", "256", "512", "1024", "2048", "4096"}) {
    Config c;
    EXPECT_EQ(warningFor("NCCL_MESH_IB_MTU", ok, &c), "") << ok;
    EXPECT_EQ(std::to_string(c.mtu), ok);
  }
  for (const char* bad : {"1500", "9000", "128", "-1", "4096B"}) {
    Config c;
    std::string w = warningFor("NCCL_MESH_IB_MTU", bad, &c);
    EXPECT_NE(w.find("accepted: 0, 256, 512, 1024, 2048, 4096"), std::string::npos) << w;
    EXPECT_EQ(c.mtu, 0);
  }
}

TEST(Config, SizesAcceptPlainBytesAndBinarySuffixes) {
  struct Case {
    const char* text;
    size_t bytes;
  };
  for (const Case& k : {Case{"0", 0}, Case{"4096", 4096}, Case{"64K", 65536}, Case{"64k", 65536},
                        Case{"1M", 1u << 20}, Case{"1G", 1u << 30}, Case{"1073741824", 1u << 30}}) {
    Config c;
    EXPECT_EQ(warningFor("NCCL_MESH_SPLIT_MIN", k.text, &c), "") << k.text;
    EXPECT_EQ(c.splitMin, k.bytes) << k.text;
  }
}

TEST(Config, SizesRejectGarbageOverflowAndOutOfRange) {
  for (const char* bad : {"2G", "1073741825", "64KB", "K", "1.5M", "-1", "64 K", "1T",
                          "18446744073709551616", "17179869184G"}) {
    Config c;
    std::string w = warningFor("NCCL_MESH_SPLIT_MIN", bad, &c);
    EXPECT_EQ(w, std::string("NCCL_MESH_SPLIT_MIN='") + bad +
                     "' is not valid (accepted: bytes 0..1G, with an optional K, M or G "
                     "suffix); using 64K");
    EXPECT_EQ(c.splitMin, 65536u);
  }
  Config c;
  EXPECT_NE(warningFor("NCCL_MESH_CHUNK_SIZE", "4095", &c), "");
  EXPECT_EQ(c.chunkSize, size_t{1} << 30);
  EXPECT_EQ(warningFor("NCCL_MESH_CHUNK_SIZE", "4K", &c), "");
  EXPECT_EQ(c.chunkSize, 4096u);
}

TEST(Config, BoolsAcceptTheUsualSpellings) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "on", "On"}) {
    Config c;
    EXPECT_EQ(warningFor("NCCL_MESH_FORCE_FLUSH", yes, &c), "") << yes;
    EXPECT_TRUE(c.forceFlush) << yes;
  }
  for (const char* no : {"0", "false", "no", "off", "OFF"}) {
    Config c;
    c.forceFlush = true;
    EXPECT_EQ(warningFor("NCCL_MESH_FORCE_FLUSH", no, &c), "") << no;
    EXPECT_FALSE(c.forceFlush) << no;
  }
  EXPECT_EQ(warningFor("NCCL_MESH_FORCE_FLUSH", "2"),
            "NCCL_MESH_FORCE_FLUSH='2' is not valid (accepted: 0/1, true/false, yes/no, "
            "on/off); using 0");
}

// NCCL_GDR_FLUSH_DISABLE is NCCL's own variable, which NCCL's IB transport reads with
// strtoll(base 0), any nonzero value disabling the flush: "2", "0x1", "-1" disabled NCCL's
// flush but not ours (a WARN, flush kept), and "yes" disabled ours but not NCCL's.
TEST(Config, NcclsOwnFlagIsReadAsNcclReadsIt) {
  for (const char* on : {"1", "2", "0x1", "-1", "010", "1abc"}) {
    Config c;
    EXPECT_EQ(warningFor("NCCL_GDR_FLUSH_DISABLE", on, &c), "") << on;
    EXPECT_TRUE(c.gdrFlushDisable) << on;
  }
  for (const char* off : {"0", "0x0", "00"}) {
    Config c;
    c.gdrFlushDisable = true;
    EXPECT_EQ(warningFor("NCCL_GDR_FLUSH_DISABLE", off, &c), "") << off;
    EXPECT_FALSE(c.gdrFlushDisable) << off;
  }
  Config c;
  EXPECT_EQ(warningFor("NCCL_GDR_FLUSH_DISABLE", "yes", &c),
            "NCCL_GDR_FLUSH_DISABLE='yes' is not valid (accepted: a number, as NCCL reads it: 0 = off, any "
            "other = on); using 0");
  EXPECT_FALSE(c.gdrFlushDisable) << "NCCL reads 'yes' as 0: the flush stays on";
}

TEST(Config, PortRangeNeedsOrderedBoundsInsideTheTcpRange) {
  Config c;
  EXPECT_EQ(warningFor("NCCL_MESH_PORT_RANGE", "40000-40000", &c), "");
  EXPECT_EQ(c.portMin, 40000);
  EXPECT_EQ(c.portMax, 40000);
  EXPECT_EQ(warningFor("NCCL_MESH_PORT_RANGE", "1 - 65535", &c), "");
  EXPECT_EQ(describe(c, "NCCL_MESH_PORT_RANGE"), "1-65535");
  for (const char* bad : {"50100-50000", "0-10", "1-65536", "5000", "-5000", "5000-", "a-b",
                          "1-2-3", "70000-80000"}) {
    Config r;
    std::string w = warningFor("NCCL_MESH_PORT_RANGE", bad, &r);
    EXPECT_NE(w.find("accepted: lo-hi with 1 <= lo <= hi <= 65535"), std::string::npos) << bad;
    EXPECT_NE(w.find("using the default (empty)"), std::string::npos) << w;
    EXPECT_EQ(r.portMin, 0) << bad;
    EXPECT_EQ(r.portMax, 0) << bad;
  }
}

TEST(Config, ListenAddrIsAnyOrEmpty) {
  Config c;
  EXPECT_EQ(warningFor("NCCL_MESH_LISTEN_ADDR", "Any", &c), "");
  EXPECT_EQ(c.listenAddr, "any");
  std::string w = warningFor("NCCL_MESH_LISTEN_ADDR", "everywhere", &c);
  EXPECT_NE(w.find("NCCL_MESH_LISTEN_ADDR='everywhere' is not valid"), std::string::npos) << w;
  EXPECT_EQ(c.listenAddr, "");
}

TEST(Config, EveryBadVariableGetsItsOwnWarningAndGoodOnesStillApply) {
  FakeEnv env{{"NCCL_MESH_IB_TIMEOUT", "99"},
              {"NCCL_MESH_IB_SL", "3"},
              {"NCCL_MESH_DEVICES", "x"},
              {"NCCL_MESH_QPS_PER_CONN", "2"}};
  std::vector<std::string> warnings;
  Config c = load(env, &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0].rfind("NCCL_MESH_DEVICES=", 0), 0u) << "table order";
  EXPECT_EQ(warnings[1].rfind("NCCL_MESH_IB_TIMEOUT=", 0), 0u);
  EXPECT_EQ(c.serviceLevel, 3);
  EXPECT_EQ(c.qpsPerConn, 2);
  EXPECT_EQ(c.ibTimeout, 20);
}

TEST(Config, WarningsOutputIsOptional) {
  FakeEnv env{{"NCCL_MESH_IB_TIMEOUT", "99"}, {"NCCL_MESH_IB_SL", "3"}};
  Config c = load(env, nullptr);
  EXPECT_EQ(c.ibTimeout, 20);
  EXPECT_EQ(c.serviceLevel, 3);
}

TEST(Config, DescribeListsEveryRowInTableOrder) {
  const std::vector<SettingInfo>& table = settingsTable();
  Config c;
  c.devices = DeviceMode::Port;
  c.splitMin = 3000;
  c.chunkSize = 2u << 20;
  c.gdrFlushDisable = true;
  c.portMin = 7;
  c.portMax = 9;
  std::vector<std::string> lines = describeConfig(c);
  ASSERT_EQ(lines.size(), table.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].rfind(std::string(table[i].name) + "=", 0), 0u) << lines[i];
  }
  EXPECT_EQ(describe(c, "NCCL_MESH_DEVICES"), "port");
  EXPECT_EQ(describe(c, "NCCL_MESH_SPLIT_MIN"), "3000");
  EXPECT_EQ(describe(c, "NCCL_MESH_CHUNK_SIZE"), "2M");
  EXPECT_EQ(describe(c, "NCCL_GDR_FLUSH_DISABLE"), "1");
  EXPECT_EQ(describe(c, "NCCL_MESH_PORT_RANGE"), "7-9");
  EXPECT_EQ(describe(Config{}, "NCCL_MESH_PORT_RANGE"), "");
}

TEST(Config, TableCoversEveryVariableOnceWithDocsAndTrueDefaults) {
  const std::vector<SettingInfo>& table = settingsTable();
  std::set<std::string> names;
  std::vector<std::string> defaults = describeConfig(Config{});
  ASSERT_EQ(defaults.size(), table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const SettingInfo& s = table[i];
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
    EXPECT_GT(std::string(s.doc).size(), 20u) << s.name;
    EXPECT_EQ(std::string(s.doc).find('\n'), std::string::npos) << "one line: " << s.name;
    EXPECT_EQ(std::string(s.doc).find('|'), std::string::npos) << "breaks a markdown table";
    EXPECT_EQ(defaults[i], std::string(s.name) + "=" + s.defaultText)
        << "defaultText must be what describeConfig prints for Config{}";
  }
  for (const char* name :
       {"NCCL_MESH_IBVERBS_LIB", "NCCL_MESH_CUDA_LIB", "NCCL_MESH_HCA", "NCCL_MESH_DEVICES", "NCCL_MESH_SPEED",
        "NCCL_MESH_GID_INDEX", "NCCL_MESH_CONNECT_TIMEOUT_MS", "NCCL_MESH_ACCEPT_WAIT_MS",
        "NCCL_MESH_PEER_TIMEOUT_MS",
        "NCCL_MESH_IB_TIMEOUT",
        "NCCL_MESH_IB_RETRY_CNT", "NCCL_MESH_IB_RNR_RETRY", "NCCL_MESH_IB_TC", "NCCL_MESH_IB_FIFO_TC", "NCCL_MESH_IB_SL", "NCCL_MESH_IB_ECE_ENABLE",
        "NCCL_MESH_IB_MTU", "NCCL_MESH_QPS_PER_CONN", "NCCL_MESH_SPLIT_MIN", "NCCL_MESH_CHUNK_SIZE",
        "NCCL_MESH_LISTEN_ADDR", "NCCL_MESH_PORT_RANGE", "NCCL_GDR_FLUSH_DISABLE", "NCCL_MESH_PCI_RELAXED_ORDERING",
        "NCCL_MESH_FORCE_FLUSH", "NCCL_MESH_RELAY", "NCCL_MESH_ROUTES", "NCCL_MESH_RELAY_PORT",
        "NCCL_MESH_RELAY_MAX_HOPS", "NCCL_MESH_RELAY_PLAN", "NCCL_MESH_RELAY_TWIN", "NCCL_MESH_RELAY_CHUNK", "NCCL_MESH_RELAY_DEPTH",
        "NCCL_MESH_RELAY_MEM", "NCCL_MESH_STATS", "NCCL_MESH_STATS_DIR", "NCCL_MESH_TRACE", "NCCL_MESH_TRACE_MAX"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  EXPECT_EQ(names.size(), 38u);
}

TEST(Config, ValuesRoundTripThroughDescribe) {
  // What the init log prints can be pasted back into the environment.
  FakeEnv env{{"NCCL_MESH_SPLIT_MIN", "96K"},
              {"NCCL_MESH_CHUNK_SIZE", "1048576"},
              {"NCCL_MESH_PORT_RANGE", "1000-2000"},
              {"NCCL_MESH_DEVICES", "port"},
              {"NCCL_MESH_ROUTES", " 198.18.2.0/24 = 198.18.0.2; 10.0.0.0/8=198.18.1.2"}};
  Config first = load(env, nullptr);
  EXPECT_EQ(first.staticRoutes.size(), 2u);
  std::map<std::string, std::string> printed;
  for (const std::string& line : describeConfig(first)) {
    size_t eq = line.find('=');
    printed.emplace(line.substr(0, eq), line.substr(eq + 1));
  }
  std::vector<std::string> warnings;
  Config second = loadConfig(
      [&](const char* name) -> const char* {
        auto it = printed.find(name);
        return it == printed.end() ? nullptr : it->second.c_str();
      },
      &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(describeConfig(second), describeConfig(first));
}

// --- relay (issue 15): validated now, not active yet ----------------------------------------

TEST(Config, RelayDefaultsToOffAcceptsAutoAndRefusesOtherValues) {
  Config d;
  EXPECT_EQ(d.relay, RelayMode::Off);
  EXPECT_EQ(describe(d, "NCCL_MESH_RELAY"), "off");
  EXPECT_TRUE(d.staticRoutes.empty());
  EXPECT_EQ(describe(d, "NCCL_MESH_RELAY_CHUNK"), "128K");
  EXPECT_EQ(describe(d, "NCCL_MESH_RELAY_MEM"), "1G");
  Config c;
  EXPECT_EQ(warningFor("NCCL_MESH_RELAY", "AUTO", &c), "");
  EXPECT_EQ(c.relay, RelayMode::Auto);
  EXPECT_EQ(describe(c, "NCCL_MESH_RELAY"), "auto");
  EXPECT_EQ(warningFor("NCCL_MESH_RELAY", "on", &c), "NCCL_MESH_RELAY='on' is not valid (accepted: off|auto); using off");
  EXPECT_EQ(c.relay, RelayMode::Off);
  EXPECT_EQ(warningFor("NCCL_MESH_RELAY", "Off", &c), "");
}

TEST(Config, BadStaticRoutesNameTheEntryAndKeepNone) {
  Config c;
  EXPECT_EQ(warningFor("NCCL_MESH_ROUTES", "198.18.2.0/24=198.18.0.2,198.18.3.5/24=198.18.1.2", &c),
            "NCCL_MESH_ROUTES='198.18.2.0/24=198.18.0.2,198.18.3.5/24=198.18.1.2' is not valid "
            "(accepted: DEST/LEN=NEXTHOP entries separated by ',' or ';'): entry 2 "
            "'198.18.3.5/24=198.18.1.2': the destination 198.18.3.5/24 has host bits set; did you "
            "mean 198.18.3.0/24?; using the default (empty)");
  EXPECT_TRUE(c.staticRoutes.empty());
}

TEST(Config, RelayRangesAreChecked) {
  for (auto [name, bad] : std::vector<std::pair<std::string, std::string>>{
           {"NCCL_MESH_RELAY_PORT", "0"},
           {"NCCL_MESH_RELAY_PORT", "65536"},
           {"NCCL_MESH_RELAY_MAX_HOPS", "0"},
           {"NCCL_MESH_RELAY_MAX_HOPS", "16"},
           {"NCCL_MESH_RELAY_CHUNK", "1K"},
           {"NCCL_MESH_RELAY_CHUNK", "65M"},
           {"NCCL_MESH_RELAY_DEPTH", "1"},
           {"NCCL_MESH_RELAY_DEPTH", "65"},
           {"NCCL_MESH_RELAY_MEM", "512K"}}) {
    Config c;
    std::string w = warningFor(name, bad, &c);
    EXPECT_EQ(w.rfind(name + "='" + bad + "' is not valid", 0), 0u) << w;
    EXPECT_EQ(describeConfig(c), describeConfig(Config{})) << name << "=" << bad;
  }
  EXPECT_EQ(warningFor("NCCL_MESH_RELAY_MAX_HOPS", "99"),
            "NCCL_MESH_RELAY_MAX_HOPS='99' is not valid (accepted: an integer 1..15); using 2");
}

TEST(Config, RelayMemorySmallerThanOneStagingRingWarnsNamingAllThree) {
  FakeEnv env{{"NCCL_MESH_RELAY_CHUNK", "4M"}, {"NCCL_MESH_RELAY_DEPTH", "64"}, {"NCCL_MESH_RELAY_MEM", "128M"}};
  std::vector<std::string> warnings;
  Config c = load(env, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "NCCL_MESH_RELAY_MEM=128M is smaller than one relayed connection's staging ring "
            "(NCCL_MESH_RELAY_CHUNK x NCCL_MESH_RELAY_DEPTH = 256M): every relayed connection "
            "would be refused; raise NCCL_MESH_RELAY_MEM or lower the other two");
  EXPECT_EQ(c.relayMem, 128u << 20) << "the values stay as set";
}

TEST(Config, NullLookupGivesDefaults) {
  std::vector<std::string> warnings;
  Config c = loadConfig(EnvLookup(), &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(describeConfig(c), describeConfig(Config{}));
}

}  // namespace
}  // namespace mesh

namespace mesh {
namespace {

// NCCL's logger cuts a message at 1023 bytes with its own prefix: the settings line with a
// few routes lost NCCL_MESH_STATS* and NCCL_MESH_TRACE*, and a long bad value's WARN lost the
// accepted values and the fallback. Lines are packed within kLogLineMax; echoed values capped.
TEST(Config, SettingsLinesFitNcclsLogLineAndKeepEverySetting) {
  std::string routes;
  for (int i = 0; i < 8; ++i) {
    routes += (i ? ";" : "") + std::string("198.18.") + std::to_string(100 + i) + ".0/24=198.18.0.2";
  }
  FakeEnv env{{"NCCL_MESH_ROUTES", routes.c_str()}, {"NCCL_MESH_TRACE", "/tmp/a-long-trace-prefix/job"}};
  Config c = load(env, nullptr);
  std::vector<std::string> items = describeConfig(c);
  std::vector<std::string> lines = packLines(items, kLogLineMax);
  EXPECT_GE(lines.size(), 2u);
  std::string all;
  for (const std::string& l : lines) {
    EXPECT_LE(l.size(), kLogLineMax) << l;
    all += l;
  }
  for (const std::string& kv : items) EXPECT_NE(all.find(" " + kv), std::string::npos) << kv;
  // One item longer than a line is cut, saying how long it was.
  std::vector<std::string> huge = packLines({"A=" + std::string(2000, 'x'), "B=1"}, 100);
  ASSERT_EQ(huge.size(), 2u);
  EXPECT_LE(huge[0].size(), 100u);
  EXPECT_NE(huge[0].find("(2002 characters)"), std::string::npos) << huge[0];
  EXPECT_EQ(huge[1], " B=1");
}

TEST(Config, AWarningForALongBadValueKeepsItsAcceptedValuesAndFallback) {
  std::string routes;
  for (int i = 0; i < 40; ++i) routes += "198.18." + std::to_string(100 + i) + ".0/24=198.18.0.2;";
  routes += "garbage";
  std::string w = warningFor("NCCL_MESH_ROUTES", routes);
  EXPECT_LT(w.size(), kLogLineMax) << w;
  EXPECT_NE(w.find("characters)' is not valid (accepted: "), std::string::npos) << w;
  EXPECT_NE(w.find("entry 41"), std::string::npos) << w;
  EXPECT_NE(w.find("; using"), std::string::npos) << w;
}

}  // namespace
}  // namespace mesh
