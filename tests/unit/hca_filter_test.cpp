// SPDX-License-Identifier: Apache-2.0
#include "mesh/discovery/hca_filter.h"

#include <gtest/gtest.h>

namespace mesh {
namespace {

TEST(HcaFilter, EmptySpecMatchesEveryDeviceAndPort) {
  for (const char* spec : {"", "   ", "\t"}) {
    std::string error;
    HcaFilter f = parseHcaFilter(spec, &error);
    EXPECT_TRUE(f.entries.empty());
    EXPECT_FALSE(f.exclude);
    EXPECT_TRUE(error.empty()) << error;
    EXPECT_TRUE(hcaMatches(f, "mlx5_0", 1));
    EXPECT_TRUE(hcaMatches(f, "rxe_p2", 2));
  }
}

TEST(HcaFilter, PlainEntriesArePrefixMatches) {
  HcaFilter f = parseHcaFilter("mlx5");
  EXPECT_FALSE(f.exclude);
  EXPECT_FALSE(f.exact);
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_TRUE(hcaMatches(f, "mlx5_0", 1));
  EXPECT_TRUE(hcaMatches(f, "mlx5_12", 2));
  EXPECT_TRUE(hcaMatches(f, "mlx5", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx4_0", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx", 1)) << "a shorter name is not a match";
  EXPECT_FALSE(hcaMatches(f, "rxe_mlx5", 1)) << "prefix, not substring";
}

TEST(HcaFilter, ExactEntriesMatchWholeNamesOnly) {
  HcaFilter f = parseHcaFilter("=mlx5_1,mlx5_2");
  EXPECT_TRUE(f.exact);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_TRUE(hcaMatches(f, "mlx5_1", 1));
  EXPECT_TRUE(hcaMatches(f, "mlx5_2", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx5_10", 1)) << "prefix matching is off with '='";
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 1));
}

TEST(HcaFilter, CaretExcludesListedDevices) {
  HcaFilter f = parseHcaFilter("^rxe_p3");
  EXPECT_TRUE(f.exclude);
  EXPECT_FALSE(f.exact);
  EXPECT_FALSE(hcaMatches(f, "rxe_p3", 1));
  EXPECT_FALSE(hcaMatches(f, "rxe_p30", 1));
  EXPECT_TRUE(hcaMatches(f, "rxe_p1", 1));
}

TEST(HcaFilter, CaretEqualsExcludesOnePortOfAnExactDevice) {
  HcaFilter f = parseHcaFilter("^=rxe_p3:1");
  EXPECT_TRUE(f.exclude);
  EXPECT_TRUE(f.exact);
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].name, "rxe_p3");
  EXPECT_EQ(f.entries[0].port, 1);
  EXPECT_FALSE(hcaMatches(f, "rxe_p3", 1));
  EXPECT_TRUE(hcaMatches(f, "rxe_p3", 2));
  EXPECT_TRUE(hcaMatches(f, "rxe_p30", 1));
  EXPECT_TRUE(hcaMatches(f, "rxe_p1", 1));
}

TEST(HcaFilter, PortRestrictsAnIncludeEntry) {
  HcaFilter f = parseHcaFilter("mlx5_0:1,mlx5_1");
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].port, 1);
  EXPECT_EQ(f.entries[1].port, -1);
  EXPECT_TRUE(hcaMatches(f, "mlx5_0", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 2));
  EXPECT_TRUE(hcaMatches(f, "mlx5_1", 1));
  EXPECT_TRUE(hcaMatches(f, "mlx5_1", 2));
}

TEST(HcaFilter, ToleratesWhitespaceAroundEntries) {
  std::string error;
  HcaFilter f = parseHcaFilter("  ^ = rxe_p1 , rxe_p2 : 2 ", &error);
  EXPECT_TRUE(error.empty()) << error;
  EXPECT_TRUE(f.exclude);
  EXPECT_TRUE(f.exact);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].name, "rxe_p1");
  EXPECT_EQ(f.entries[0].port, -1);
  EXPECT_EQ(f.entries[1].name, "rxe_p2");
  EXPECT_EQ(f.entries[1].port, 2);
}

TEST(HcaFilter, MalformedEntriesAreReportedAndSkipped) {
  std::string error;
  HcaFilter f = parseHcaFilter("mlx5_0:x,:1,mlx5_1,mlx5_2:0,mlx5_3:256,mlx5_5:1:a,mlx5_6:1:0:0:0", &error);
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].name, "mlx5_1");
  EXPECT_NE(error.find("'mlx5_0:x'"), std::string::npos) << error;
  EXPECT_NE(error.find("':1' has no device name"), std::string::npos) << error;
  EXPECT_NE(error.find("'mlx5_2:0'"), std::string::npos) << error;
  EXPECT_NE(error.find("'mlx5_3:256'"), std::string::npos) << error;
  EXPECT_NE(error.find("1..255"), std::string::npos) << error;
  EXPECT_NE(error.find("'mlx5_5:1:a' has rail 'a'"), std::string::npos) << error;
  EXPECT_NE(error.find("'mlx5_6:1:0:0:0' has more fields"), std::string::npos) << error;
  EXPECT_TRUE(hcaMatches(f, "mlx5_1", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 1));
}

// NCCL 2.30 reads NCCL_IB_HCA entries as name:port:rail:plane (misc/utils.cc
// parseStringList): an empty port is every port, rail and plane follow. A value copied from
// NCCL_IB_HCA selects here what it selects there; those entries were refused, and a list of
// only such entries became "no filter": every port of every device.
TEST(HcaFilter, NcclsPortRailAndPlaneFieldsAreRead) {
  std::string error;
  HcaFilter f = parseHcaFilter("rocep1s0f1:1:0:1", &error);
  EXPECT_TRUE(error.empty()) << error;
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].port, 1);
  EXPECT_TRUE(hcaMatches(f, "rocep1s0f1", 1));
  EXPECT_FALSE(hcaMatches(f, "rocep1s0f1", 2));
  EXPECT_FALSE(hcaMatches(f, "roceP2p1s0f1", 1));

  error.clear();
  f = parseHcaFilter("=rocep1s0f1:", &error);
  EXPECT_TRUE(error.empty()) << error;
  EXPECT_TRUE(hcaMatches(f, "rocep1s0f1", 1));
  EXPECT_TRUE(hcaMatches(f, "rocep1s0f1", 2));
  EXPECT_FALSE(hcaMatches(f, "roceP2p1s0f1", 1));

  f = parseHcaFilter("^mlx5_0:", &error);  // every port of mlx5_0 excluded
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 1));
  EXPECT_TRUE(hcaMatches(f, "mlx5_1", 1));
}

// An include list of only malformed entries selects nothing (NCCL: "mlx5_0:0" matches no
// port), never everything; an exclude list of them excludes nothing.
TEST(HcaFilter, AListOfOnlyMalformedEntriesIsNotEverything) {
  std::string error;
  HcaFilter f = parseHcaFilter("mlx5_0:0", &error);
  EXPECT_FALSE(error.empty());
  EXPECT_TRUE(f.entries.empty());
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx5_1", 1));
  f = parseHcaFilter("^mlx5_0:x", &error);
  EXPECT_TRUE(hcaMatches(f, "mlx5_0", 1));
  f = parseHcaFilter("", &error);
  EXPECT_TRUE(hcaMatches(f, "mlx5_0", 1)) << "unset: no filter";
}

TEST(HcaFilter, EmptyEntriesBetweenCommasAreReported) {
  std::string error;
  HcaFilter f = parseHcaFilter("mlx5_0,,mlx5_1,", &error);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_NE(error.find("empty entry"), std::string::npos) << error;
}

TEST(HcaFilter, ErrorOutputIsOptional) {
  HcaFilter f = parseHcaFilter("mlx5_0:bad,mlx5_1");
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].name, "mlx5_1");
}

TEST(HcaFilter, BareCaretOrEqualsNamesNothingAndIsReported) {
  for (const char* spec : {"^", "=", "^="}) {
    std::string error;
    HcaFilter f = parseHcaFilter(spec, &error);
    EXPECT_TRUE(f.entries.empty()) << spec;
    EXPECT_TRUE(hcaMatches(f, "mlx5_0", 1)) << spec;
    EXPECT_NE(error.find("names no device"), std::string::npos) << spec << ": " << error;
  }
}

TEST(HcaFilter, ExcludeEveryPortOfSeveralDevices) {
  HcaFilter f = parseHcaFilter("^mlx5_0,mlx5_1:2");
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx5_0", 2));
  EXPECT_TRUE(hcaMatches(f, "mlx5_1", 1));
  EXPECT_FALSE(hcaMatches(f, "mlx5_1", 2));
  EXPECT_TRUE(hcaMatches(f, "rxe0", 1));
}

}  // namespace
}  // namespace mesh
