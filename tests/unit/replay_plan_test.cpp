// SPDX-License-Identifier: Apache-2.0
// tests/replay's plan: traces grouped into processes, placed on nodes by their addresses,
// and the cabling read back as fabric-net's full/ring/line, with its functions per cable end.
#include <gtest/gtest.h>

#include "../replay/replay_plan.h"

namespace replay {
namespace {

TraceFile traceOf(const std::string& name, long pid, std::vector<std::string> addrs, uint64_t t0 = 1) {
  TraceFile f;
  f.name = name;
  f.path = "/x/" + name;
  f.trace.header.host = "h";
  f.trace.header.pid = pid;
  f.trace.header.t0Ns = t0;
  f.trace.header.addrs = std::move(addrs);
  return f;
}

// The lab's 4-ring: links (0,1)=L0, (0,3)=L1, (1,2)=L2, (2,3)=L3.
std::vector<TraceFile> ring4() {
  return {traceOf("a", 10, {"198.18.0.1/24", "198.18.1.1/24"}), traceOf("b", 11, {"198.18.0.2/24", "198.18.2.2/24"}),
          traceOf("c", 12, {"198.18.2.3/24", "198.18.3.3/24"}), traceOf("d", 13, {"198.18.1.4/24", "198.18.3.4/24"})};
}

TEST(ReplayPlan, ARingIsReadBackAsARing) {
  Plan plan;
  std::string error;
  ASSERT_TRUE(makePlan(ring4(), &plan, &error)) << error;
  EXPECT_EQ(plan.nodes, 4);
  EXPECT_EQ(plan.topology, "ring");
  EXPECT_EQ(plan.links, 1);
  ASSERT_EQ(plan.processes.size(), 4u);
  EXPECT_EQ(plan.processes[3].node, 3);
  EXPECT_EQ(plan.files[plan.processes[3].files[0]].name, "d");
}

TEST(ReplayPlan, FullMeshLineAndParallelLinks) {
  Plan plan;
  std::string error;
  ASSERT_TRUE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.1.1/24"}),
                        traceOf("b", 2, {"198.18.0.2/24", "198.18.2.2/24"}),
                        traceOf("c", 3, {"198.18.1.3/24", "198.18.2.3/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.topology, "full");
  ASSERT_TRUE(makePlan({traceOf("a", 1, {"198.18.0.1/24"}), traceOf("b", 2, {"198.18.0.2/24", "198.18.1.2/24"}),
                        traceOf("c", 3, {"198.18.1.3/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.topology, "line");
  ASSERT_TRUE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.1.1/24"}),
                        traceOf("b", 2, {"198.18.0.2/24", "198.18.1.2/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.links, 2);
}

// DGX Spark cables (fabric-net --functions 2): node n's second function on cable L is
// 198.18.L.(128+n+1) (--fn-subnets shared, as the GPU machine's ring4-spark-relay traces read)
// or 198.18.(128+L).(n+1) (split).
TEST(ReplayPlan, TwoFunctionsPerCableEndAreReadBack) {
  Plan plan;
  std::string error;
  ASSERT_TRUE(makePlan({traceOf("a", 10, {"198.18.0.1/24", "198.18.0.129/24", "198.18.1.1/24", "198.18.1.129/24"}),
                        traceOf("b", 11, {"198.18.0.2/24", "198.18.0.130/24", "198.18.2.2/24", "198.18.2.130/24"}),
                        traceOf("c", 12, {"198.18.2.3/24", "198.18.2.131/24", "198.18.3.3/24", "198.18.3.131/24"}),
                        traceOf("d", 13, {"198.18.1.4/24", "198.18.1.132/24", "198.18.3.4/24", "198.18.3.132/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.nodes, 4);
  EXPECT_EQ(plan.topology, "ring");
  EXPECT_EQ(plan.links, 1);
  EXPECT_EQ(plan.functions, 2);
  EXPECT_EQ(plan.fnSubnets, "shared");
  ASSERT_EQ(plan.processes.size(), 4u);
  EXPECT_EQ(plan.processes[0].node, 0);
  EXPECT_EQ(plan.files[plan.processes[0].files[0]].name, "a");
  EXPECT_EQ(plan.files[plan.processes[3].files[0]].name, "d");
  EXPECT_NE(describePlan(plan).find("4 nodes, ring, 1 link(s) per pair, 2 functions per cable end (shared subnets):"),
            std::string::npos)
      << describePlan(plan);

  // The order of the addresses does not matter, and a pair's second function reads the same.
  ASSERT_TRUE(makePlan({traceOf("a", 1, {"198.18.0.129/24", "198.18.0.1/24"}),
                        traceOf("b", 2, {"198.18.0.2/24", "198.18.0.130/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.nodes, 2);
  EXPECT_EQ(plan.links, 1);
  EXPECT_EQ(plan.functions, 2);

  ASSERT_TRUE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.128.1/24"}),
                        traceOf("b", 2, {"198.18.0.2/24", "198.18.128.2/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.links, 1);
  EXPECT_EQ(plan.functions, 2);
  EXPECT_EQ(plan.fnSubnets, "split");

  // One function per end: plain traces, and cables numbered from 128 up without a first
  // function 128 below them (more than 128 cables) are cables of their own.
  ASSERT_TRUE(makePlan(ring4(), &plan, &error)) << error;
  EXPECT_EQ(plan.functions, 1);
  EXPECT_EQ(describePlan(plan).find("functions"), std::string::npos) << describePlan(plan);
  ASSERT_TRUE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.130.1/24"}),
                        traceOf("b", 2, {"198.18.0.2/24", "198.18.130.2/24"})},
                       &plan, &error))
      << error;
  EXPECT_EQ(plan.links, 2);
  EXPECT_EQ(plan.functions, 1);
}

TEST(ReplayPlan, FunctionsFabricNetCannotCableAreNamed) {
  Plan plan;
  std::string error;
  // A second function whose first is not in the trace (another node's, or none).
  EXPECT_FALSE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.0.130/24"}),
                         traceOf("b", 2, {"198.18.0.2/24", "198.18.0.130/24"})},
                        &plan, &error));
  EXPECT_NE(error.find("a: address 198.18.0.130 is a second PCIe function"), std::string::npos) << error;
  EXPECT_NE(error.find("no first function 198.18.0.2 beside it in 198.18.0.0/24"), std::string::npos) << error;
  // Two nodes' first functions in one trace, each with its second.
  EXPECT_FALSE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.0.129/24", "198.18.1.2/24", "198.18.1.130/24"}),
                         traceOf("b", 2, {"198.18.0.2/24", "198.18.0.130/24"})},
                        &plan, &error));
  EXPECT_NE(error.find("a: its addresses name two nodes (0 and 1)"), std::string::npos) << error;
  // One end with two functions, the other end of the cable with one.
  EXPECT_FALSE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.0.129/24"}), traceOf("b", 2, {"198.18.0.2/24"})},
                        &plan, &error));
  EXPECT_NE(error.find("different numbers of PCIe functions (a: 2 on 198.18.0.0/24; b: 1 on 198.18.0.0/24)"),
            std::string::npos)
      << error;
  // Both numberings of second functions in one job.
  EXPECT_FALSE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.0.129/24", "198.18.129.1/24", "198.18.1.1/24"}),
                         traceOf("b", 2, {"198.18.0.2/24", "198.18.0.130/24", "198.18.129.2/24", "198.18.1.2/24"})},
                        &plan, &error));
  EXPECT_NE(error.find("--fn-subnets takes one"), std::string::npos) << error;
}

TEST(ReplayPlan, ReloadsOfOneProcessReplayInOrderInOneProcess) {
  std::vector<TraceFile> files = ring4();
  files.push_back(traceOf("a2", 10, {"198.18.0.1/24", "198.18.1.1/24"}, 0));  // loaded first
  Plan plan;
  std::string error;
  ASSERT_TRUE(makePlan(files, &plan, &error)) << error;
  ASSERT_EQ(plan.processes.size(), 4u);
  ASSERT_EQ(plan.processes[0].files.size(), 2u);
  EXPECT_EQ(plan.files[plan.processes[0].files[0]].name, "a2");
}

TEST(ReplayPlan, WhatCannotBePlacedIsNamed) {
  Plan plan;
  std::string error;
  std::vector<TraceFile> missing = ring4();
  missing.erase(missing.begin() + 2);
  EXPECT_FALSE(makePlan(missing, &plan, &error));
  EXPECT_NE(error.find("node 2 has no trace"), std::string::npos) << error;
  missing = ring4();
  missing.pop_back();  // node 3's cables then have one traced end each
  EXPECT_FALSE(makePlan(missing, &plan, &error));
  EXPECT_NE(error.find("1 traced node(s), expected 2"), std::string::npos) << error;

  EXPECT_FALSE(makePlan({traceOf("a", 1, {"10.0.0.1/24"}), traceOf("b", 2, {"10.0.0.2/24"})}, &plan, &error));
  EXPECT_NE(error.find("not on the lab's plan"), std::string::npos) << error;

  EXPECT_FALSE(makePlan({traceOf("a", 1, {"198.18.0.1/24", "198.18.1.2/24"})}, &plan, &error));
  EXPECT_NE(error.find("two nodes"), std::string::npos) << error;

  EXPECT_FALSE(makePlan({traceOf("a", 1, {}), traceOf("b", 2, {"198.18.0.2/24"})}, &plan, &error));
  EXPECT_NE(error.find("no mesh address"), std::string::npos) << error;

  EXPECT_FALSE(makePlan({traceOf("a", 1, {"198.18.0.1/24"}), traceOf("c", 3, {"198.18.0.3/24"})}, &plan, &error));
  EXPECT_NE(error.find("node 1 has no trace"), std::string::npos) << error;
}

}  // namespace
}  // namespace replay
