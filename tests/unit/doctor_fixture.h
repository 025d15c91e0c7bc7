// SPDX-License-Identifier: Apache-2.0
// A fake node for nccl-mesh-info --doctor's checks: a temporary root with /proc, /sys and
// /etc files, and fake live sources (interfaces, python3's sys.path, library probes). The
// default tree is a healthy 3-node triangle member on which every check is OK; each test
// breaks one thing and looks at one check's verdict.
#pragma once

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "mesh/tools/doctor.h"

namespace mesh {

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mesh-doctor-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    put("proc/self/limits", "Limit                     Soft Limit           Hard Limit           Units\n"
                            "Max open files            1024                 4096                 files\n"
                            "Max locked memory         unlimited            unlimited            bytes\n");
    put("proc/self/status", "Name:\tdoctor\nCapEff:\t0000000000000000\n");
    put("proc/meminfo", "MemTotal:       131072000 kB\nCmaTotal:          65536 kB\nCmaFree:           60000 kB\n");
    put("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro");
    for (const char* i : {"all", "p1", "p2"}) {
      for (const char* k : {"arp_ignore", "arp_announce", "rp_filter"}) {
        put(std::string("proc/sys/net/ipv4/conf/") + i + "/" + k, "0");
      }
    }
    addPort("rxe_p1", "p1", "198.18.0.1");
    addPort("rxe_p2", "p2", "198.18.1.1");
    put("py/site-packages/torch/__init__.py", "");
    put("py/site-packages/nvidia/nccl/lib/libnccl.so.2", "");
    src_.root = root_;
    src_.env = {{"NCCL_NET_PLUGIN", "mesh"}, {"NCCL_NET", "Mesh"}, {"NCCL_SOCKET_IFNAME", "mgmt"}, {"HOME", "/home/u"}};
    src_.nodes = 3;
    netifs_ = {{"lo", 65536, true, {{0x7f000001, 8}}, 0},
               {"mgmt", 1500, true, {{0x0a000001, 24}}, 0},
               {"p1", 9000, true, {{0xc6120001, 24}}, 0},
               {"p2", 9000, true, {{0xc6120101, 24}}, 0}};
    src_.interfaces = [this] { return netifs_; };
    src_.pythonPath = [this](std::string* error) {
      *error = "python3 is not on PATH";
      return sysPath_;
    };
    src_.probeNccl = [this](const std::string& path) {
      LibProbe p;
      probed_.push_back(path);
      p.loaded = ncclCode_ > 0;
      p.version = decodeNcclVersionCode(ncclCode_);
      if (!p.loaded) p.error = "crashed while loading (signal 11, Segmentation fault)";
      return p;
    };
    src_.probePlugin = [this](const std::string& spec) {
      LibProbe p;
      pluginSpec_ = spec;
      p.loaded = pluginMask_ >= 0;
      p.abiMask = pluginMask_ < 0 ? 0 : pluginMask_;
      p.path = "/usr/lib/libnccl-net-mesh.so";
      if (!p.loaded) p.error = "libnccl-net-mesh.so: cannot open shared object file: No such file or directory";
      return p;
    };
    src_.loadVerbs = [this](const Config&) { return verbsError_; };
    src_.verbsPorts = [](const Config&, std::string* note) {
      *note = "rdma-core lists no RDMA device";
      return std::vector<PortFact>();
    };
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void put(const std::string& rel, const std::string& text) {
    std::string path = root_ + "/" + rel;
    std::filesystem::create_directories(path.substr(0, path.rfind('/')));
    std::ofstream(path) << text << "\n";
  }
  void remove(const std::string& rel) { std::filesystem::remove_all(root_ + "/" + rel); }
  void mkdir(const std::string& rel) { std::filesystem::create_directories(root_ + "/" + rel); }

  // An ACTIVE RoCE port: GID 0 link-local, GID 1 the IPv4 address, both RoCE v2.
  void addPort(const std::string& dev, const std::string& netdev, const std::string& ipv4) {
    std::string base = "sys/class/infiniband/" + dev + "/ports/1/";
    put(base + "state", "4: ACTIVE");
    put(base + "link_layer", "Ethernet");
    put(base + "gids/0", "fe80:0000:0000:0000:5054:00ff:fe12:3456");
    put(base + "gids/1", "0000:0000:0000:0000:0000:ffff:" + hexPair(ipv4));
    for (const char* i : {"0", "1"}) {
      put(base + "gid_attrs/types/" + i, "RoCE v2");
      put(base + "gid_attrs/ndevs/" + i, netdev);
    }
  }
  // "198.18.0.1" -> "c612:0001"
  static std::string hexPair(const std::string& ipv4) {
    unsigned a, b, c, d;
    sscanf(ipv4.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d);
    char buf[16];
    snprintf(buf, sizeof(buf), "%02x%02x:%02x%02x", a, b, c, d);
    return buf;
  }

  NetIf& netif(const std::string& name) {
    for (NetIf& n : netifs_) {
      if (n.name == name) return n;
    }
    netifs_.push_back(NetIf{name, 1500, true, {}, 0});
    return netifs_.back();
  }

  std::vector<CheckResult> run() {
    facts_ = collectFacts(src_);
    return runChecks(facts_);
  }
  // Runs the checks: `name`'s verdict must be `expected`, and its text mention `part`.
  CheckResult expectCheck(const std::string& name, Verdict expected, const std::string& part = "") {
    CheckResult r = check(name);
    EXPECT_EQ(verdictName(r.verdict), std::string(verdictName(expected))) << name << ": " << r.found << " | fix: " << r.fix;
    EXPECT_NE(r.found.find(part), std::string::npos) << name << ": " << r.found;
    return r;
  }
  CheckResult check(const std::string& name) {
    for (const CheckResult& r : run()) {
      if (r.name == name) return r;
    }
    ADD_FAILURE() << "no check named " << name;
    return {};
  }

  std::string root_;
  DoctorSources src_;
  DoctorFacts facts_;
  std::vector<NetIf> netifs_;
  std::vector<std::string> sysPath_ = {"/py/site-packages"};
  std::vector<std::string> probed_;
  std::string pluginSpec_;
  int ncclCode_ = 22809;  // 2.28.9, PyTorch 2.11's
  int pluginMask_ = 0x1f00;  // v8..v12
  std::string verbsError_;
};

// The check's verdict, and its text when it is not the one expected.
#define EXPECT_VERDICT(result, expected)                                                            \
  do {                                                                                              \
    CheckResult r_ = (result);                                                                      \
    EXPECT_EQ(verdictName(r_.verdict), std::string(verdictName(expected))) << r_.name << ": " << r_.found \
                                                                            << " | fix: " << r_.fix;  \
  } while (0)

// `text` contains `part` (and is shown when it does not).
#define EXPECT_MENTIONS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

}  // namespace mesh
