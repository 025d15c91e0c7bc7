// SPDX-License-Identifier: Apache-2.0
// The RDMA NIC's sysfs counters (stats/nic_counters.h) read from a fake tree: two devices,
// their ports in numeric order, the data counters in 4-byte units, hw_counters by name, and
// the files that exist but cannot be read or parsed, each named in a warning. The tests run
// as root, which chmod 000 does not stop: the unreadable "file" is a directory.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mesh/stats/nic_counters.h"
#include "temp_dir.h"

namespace mesh {
namespace stats {
namespace {

class NicCounters : public ::testing::Test {
 protected:

  std::string path(const std::string& rel) const { return root_ + "/" + rel; }
  void put(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path(rel)).parent_path());
    std::ofstream(path(rel)) << text;
  }
  void mkdir(const std::string& rel) { std::filesystem::create_directories(path(rel)); }
  // The counters/ files of the port folder `port` (relative to the root).
  void putData(const std::string& port, uint64_t tx, uint64_t rx, uint64_t txp, uint64_t rxp) {
    put(port + "/counters/port_xmit_data", std::to_string(tx) + "\n");
    put(port + "/counters/port_rcv_data", std::to_string(rx) + "\n");
    put(port + "/counters/port_xmit_packets", std::to_string(txp) + "\n");
    put(port + "/counters/port_rcv_packets", std::to_string(rxp) + "\n");
    put(port + "/counters/symbol_error", "0\n");  // one the reader does not look at
  }

  // mlx5_1 is a real folder; mlx5_0 is a symlink into devices/, as sysfs has it. mlx5_0
  // has ports 1, 2 and 10 (10 without counters/ and hw_counters/), mlx5_1 ports 1 and 2.
  void buildTree() {
    const std::string ib = "sys/class/infiniband/";
    const std::string dev0 = "sys/devices/pci0000:00/0000:01:00.0/infiniband/mlx5_0";
    mkdir(dev0);
    mkdir(ib);
    ASSERT_EQ(symlink(path(dev0).c_str(), path(ib + "mlx5_0").c_str()), 0);
    putData(dev0 + "/ports/1", uint64_t(1) << 40, 250, 7, 9);
    put(dev0 + "/ports/1/hw_counters/roce_adp_retrans", "5\n");
    put(dev0 + "/ports/1/hw_counters/out_of_sequence", "3\n");
    put(dev0 + "/ports/1/hw_counters/np_cnp_sent", "12\n");
    put(dev0 + "/ports/1/hw_counters/lifespan", "10\n");  // a setting, not a counter
    putData(dev0 + "/ports/2", 1, 2, 3, 4);
    put(dev0 + "/ports/2/hw_counters/rp_cnp_handled", "garbage\n");
    mkdir(dev0 + "/ports/2/hw_counters/packet_seq_err");  // opens, but read() says EISDIR
    put(dev0 + "/ports/2/hw_counters/local_ack_timeout_err", "18446744073709551616\n");  // 2^64
    put(dev0 + "/ports/2/hw_counters/rnr_nak_retry_err", "0\n");
    mkdir(dev0 + "/ports/10");
    putData(ib + "mlx5_1/ports/1", 100, 200, 1, 2);
    putData(ib + "mlx5_1/ports/2", 100, 200, 1, 2);
    put(ib + "mlx5_1/ports/2/counters/port_rcv_data", "12abc\n");  // the port has no data then
    put(ib + "mlx5_1/ports/lost+found", "");  // not a port
  }

  TempDir tmp_{"mesh-nic-"};
  std::string root_ = tmp_.path();
};

bool mentions(const std::vector<std::string>& warnings, const std::string& what) {
  for (const std::string& w : warnings) {
    if (w.find(what) != std::string::npos) return true;
  }
  return false;
}

TEST_F(NicCounters, ReadsEveryPortSortedWithBytesInFourByteUnits) {
  buildTree();
  std::vector<std::string> warnings;
  std::vector<NicPortCounters> ports = readNicCounters(root_, &warnings);
  ASSERT_EQ(ports.size(), 5u);
  const std::vector<std::pair<std::string, int>> order = {{"mlx5_0", 1}, {"mlx5_0", 2}, {"mlx5_0", 10}, {"mlx5_1", 1}, {"mlx5_1", 2}};
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(ports[i].device, order[i].first) << i;
    EXPECT_EQ(ports[i].port, order[i].second) << i;
  }
  const NicPortCounters& p1 = ports[0];
  EXPECT_TRUE(p1.haveData);
  EXPECT_EQ(p1.txBytes, uint64_t(1) << 42);
  EXPECT_EQ(p1.rxBytes, 1000u);
  EXPECT_EQ(p1.txPackets, 7u);
  EXPECT_EQ(p1.rxPackets, 9u);
  const std::vector<std::pair<std::string, uint64_t>> hw = {{"np_cnp_sent", 12}, {"out_of_sequence", 3}, {"roce_adp_retrans", 5}};
  EXPECT_EQ(p1.hw, hw);  // sorted by name; lifespan left out
  EXPECT_EQ(hwValue(p1, "roce_adp_retrans"), 5u);
  EXPECT_EQ(hwValue(p1, "packet_seq_err"), 0u);
  EXPECT_EQ(hwValue(p1, ""), 0u);

  // Port 2: its data counters, and only the one hw counter that reads as a count.
  EXPECT_TRUE(ports[1].haveData);
  EXPECT_EQ(ports[1].txBytes, 4u);
  ASSERT_EQ(ports[1].hw.size(), 1u);
  EXPECT_EQ(ports[1].hw[0].first, "rnr_nak_retry_err");

  // A port without counters/ or hw_counters/ is listed, with no data and no warning.
  EXPECT_FALSE(ports[2].haveData);
  EXPECT_TRUE(ports[2].hw.empty());
  EXPECT_FALSE(mentions(warnings, "/ports/10"));

  EXPECT_TRUE(ports[3].haveData);
  EXPECT_EQ(ports[3].rxBytes, 800u);
  // One unparsable data counter: no data for the port (its readable ones are not half shown).
  EXPECT_FALSE(ports[4].haveData);
  EXPECT_EQ(ports[4].txBytes, 0u);
  EXPECT_EQ(ports[4].txPackets, 0u);
}

TEST_F(NicCounters, WarnsNamingEachFileThatCannotBeReadOrParsed) {
  buildTree();
  std::vector<std::string> warnings;
  readNicCounters(root_, &warnings);
  const std::string dev0 = root_ + "/sys/class/infiniband/mlx5_0/ports/2/hw_counters/";
  const std::string dev1 = root_ + "/sys/class/infiniband/mlx5_1/ports/2/counters/";
  EXPECT_TRUE(mentions(warnings, "cannot read " + dev0 + "packet_seq_err: " + std::strerror(EISDIR)))
      << ::testing::PrintToString(warnings);
  EXPECT_TRUE(mentions(warnings, "cannot parse " + dev0 + "rp_cnp_handled: \"garbage\""))
      << ::testing::PrintToString(warnings);
  EXPECT_TRUE(mentions(warnings, "cannot parse " + dev0 + "local_ack_timeout_err"))  // past 64 bits
      << ::testing::PrintToString(warnings);
  EXPECT_TRUE(mentions(warnings, "cannot parse " + dev1 + "port_rcv_data: \"12abc\""))
      << ::testing::PrintToString(warnings);
  EXPECT_EQ(warnings.size(), 4u) << ::testing::PrintToString(warnings);
  std::vector<std::string> again;
  readNicCounters(root_ + "/", &again);  // a root with its slash names the same paths
  EXPECT_EQ(again, warnings);
}

TEST_F(NicCounters, NoInfinibandClassIsAnEmptyListAndNoWarning) {
  std::vector<std::string> warnings;
  EXPECT_TRUE(readNicCounters(root_, &warnings).empty());
  EXPECT_TRUE(readNicCounters(root_ + "/no/such/root", &warnings).empty());
  mkdir("sys/class/infiniband");  // the class without devices: rdma-core loaded, no NIC
  EXPECT_TRUE(readNicCounters(root_, &warnings).empty());
  EXPECT_TRUE(warnings.empty()) << ::testing::PrintToString(warnings);
}

TEST_F(NicCounters, ADeviceWithoutPortsIsSkipped) {
  mkdir("sys/class/infiniband/mlx5_9");
  putData("sys/class/infiniband/mlx5_0/ports/1", 1, 1, 1, 1);
  std::vector<std::string> warnings;
  std::vector<NicPortCounters> ports = readNicCounters(root_, &warnings);
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_EQ(ports[0].device, "mlx5_0");
  EXPECT_TRUE(warnings.empty()) << ::testing::PrintToString(warnings);
}

TEST(NicWatchedCounters, AreUniqueAndLeadWithRetransmissions) {
  const std::vector<std::string>& w = watchedHwCounters();
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w.front(), "roce_adp_retrans");
  for (size_t i = 0; i < w.size(); ++i) {
    for (size_t j = i + 1; j < w.size(); ++j) EXPECT_NE(w[i], w[j]);
  }
  for (const char* name : {"out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "np_cnp_sent", "rp_cnp_handled"}) {
    EXPECT_NE(std::find(w.begin(), w.end(), name), w.end()) << name;
  }
}

}  // namespace
}  // namespace stats
}  // namespace mesh
