// SPDX-License-Identifier: Apache-2.0
// NCCL_MESH_HCA include entries that select no device: which ones are reported, and the
// messages of the parser no longer name the variable (the caller prefixes it once).
#include <gtest/gtest.h>

#include "mesh/discovery/hca_filter.h"

namespace mesh {
namespace {

std::vector<std::string> unmatchedTexts(const std::string& spec, const std::vector<HcaDevice>& devs) {
  std::vector<std::string> out;
  for (const HcaFilter::Entry& e : unmatchedHcaEntries(parseHcaFilter(spec), devs)) {
    out.push_back(hcaEntryText(e));
  }
  return out;
}

const std::vector<HcaDevice> kLab = {{"rxe_p1", 1}, {"rxe_p2", 1}};

TEST(HcaUnmatched, EveryEntryThatSelectsSomethingIsQuiet) {
  EXPECT_TRUE(unmatchedTexts("rxe", kLab).empty());
  EXPECT_TRUE(unmatchedTexts("rxe_p1,rxe_p2:1", kLab).empty());
  EXPECT_TRUE(unmatchedTexts("=rxe_p1", kLab).empty());
  EXPECT_TRUE(unmatchedTexts("", kLab).empty());
}

TEST(HcaUnmatched, TyposMissingDevicesAndMissingPortsAreNamed) {
  EXPECT_EQ(unmatchedTexts("rxe_p1,mlx5_0", kLab), std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(unmatchedTexts("rxe_p1:2", kLab), std::vector<std::string>{"rxe_p1:2"});
  // '=' means exact names: a prefix of a real name selects nothing.
  EXPECT_EQ(unmatchedTexts("=rxe_p,rxe_p2", kLab), std::vector<std::string>{"rxe_p"});
  EXPECT_EQ(unmatchedTexts("a,b", {}), (std::vector<std::string>{"a", "b"}));
}

TEST(HcaUnmatched, ExcludeEntriesNeverWarn) {
  EXPECT_TRUE(unmatchedTexts("^mlx5_0", kLab).empty());
  EXPECT_TRUE(unmatchedTexts("^=nothing:3", kLab).empty());
}

TEST(HcaUnmatched, ADeviceWithUnknownPortsCountsAsHavingThePort) {
  EXPECT_TRUE(unmatchedTexts("mlx5_0:2", {{"mlx5_0", -1}}).empty());
}

TEST(HcaUnmatched, ParserMessagesDoNotRepeatTheVariableName) {
  for (const char* spec : {"^", "mlx5_0:x", ",mlx5_1"}) {
    std::string error;
    parseHcaFilter(spec, &error);
    ASSERT_FALSE(error.empty()) << spec;
    EXPECT_EQ(error.find("NCCL_MESH_HCA"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace mesh
