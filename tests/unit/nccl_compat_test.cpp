// SPDX-License-Identifier: Apache-2.0
// What each NCCL release does with the plugin (nccl_compat.h), as the init log line and
// nccl-mesh-info --doctor say it.
#include <gtest/gtest.h>

#include "mesh/plugin/nccl_compat.h"

namespace mesh {
namespace {

TEST(NcclCompat, DecodesBothVersionCodeFormats) {
  EXPECT_EQ(decodeNcclVersionCode(22809).text(), "2.28.9");
  EXPECT_EQ(decodeNcclVersionCode(23007).text(), "2.30.7");
  EXPECT_EQ(decodeNcclVersionCode(2804).text(), "2.8.4");  // before 2.9: X*1000 + Y*100 + Z
  EXPECT_FALSE(decodeNcclVersionCode(0).known());
  EXPECT_FALSE(decodeNcclVersionCode(-5).known());
}

TEST(NcclCompat, AbiTakenPerRelease) {
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(21903)), 0);
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(22005)), 8);
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(22304)), 8);
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(22503)), 9);
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(22707)), 10);
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(22809)), 11);
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(23007)), 12);
  EXPECT_EQ(abiListText(ncclAbiSearchOrder(decodeNcclVersionCode(22809))), "v11, v10, v9, v8, v7, v6");
  EXPECT_EQ(abiListText(ncclAbiSearchOrder(decodeNcclVersionCode(23007))).rfind("v12, v11", 0), 0u);
}

TEST(NcclCompat, FeaturesLackingNameTheRelease) {
  auto lacks = ncclFeaturesLacking(decodeNcclVersionCode(22005));
  std::string all;
  for (const NcclLack& l : lacks) all += l.feature + "|";
  EXPECT_NE(all.find("absolute NCCL_NET_PLUGIN path (2.21)"), std::string::npos) << all;
  EXPECT_NE(all.find("run-time connect (2.22)"), std::string::npos) << all;
  EXPECT_TRUE(ncclFeaturesLacking(decodeNcclVersionCode(22809)).empty());
}

TEST(NcclCompat, LoaderLineFromGetVersionOrFromTheAbi) {
  EXPECT_EQ(describeLoader(decodeNcclVersionCode(22809), "/x/libnccl.so.2", 11),
            "loaded by NCCL 2.28.9 (ncclGetVersion in /x/libnccl.so.2), through ncclNet v11");
  EXPECT_NE(describeLoader(NcclVersion(), "", 11).find("loaded through ncclNet v11: NCCL 2.28 - 2.29"),
            std::string::npos);
  EXPECT_NE(describeLoader(decodeNcclVersionCode(23007), "", 11).find("itself takes v12"), std::string::npos);
}

// NCCL 2.31 (v2.31.2-1) and 2.32 (2.32.3) were released after the newest source read (2.30.7-1):
// the loader line says its ABI order is assumed, not read; for 2.30 and older it says nothing.
TEST(NcclCompat, LoaderLineSaysWhenTheNcclIsNewerThanTheLastRead) {
  EXPECT_EQ(describeLoader(decodeNcclVersionCode(23203), "", 12),
            "loaded by NCCL 2.32.3 (ncclGetVersion), through ncclNet v12 (NCCL 2.32 is newer than 2.30, the newest "
            "release whose plugin loader this build was checked against: its ABI order is taken to be 2.30's)");
  EXPECT_EQ(ncclAbiTaken(decodeNcclVersionCode(23102)), 12);
  EXPECT_TRUE(ncclUnreadNote(decodeNcclVersionCode(23007)).empty());
  EXPECT_TRUE(ncclUnreadNote(NcclVersion()).empty());
  EXPECT_FALSE(ncclUnreadNote(decodeNcclVersionCode(30000)).empty());
  EXPECT_EQ(describeLoader(decodeNcclVersionCode(23007), "", 12), "loaded by NCCL 2.30.7 (ncclGetVersion), through ncclNet v12");
}

// NCCL 2.28.9 under PyTorch 2.11 on the GPU machine: a second communicator after the first one's
// destroy failed with "Failed to initialize any NET plugin" (tri-reload, tri-preload).
TEST(NcclCompat, ReloadAdviceForTheReleasesThatForgetThePluginName) {
  EXPECT_NE(ncclReloadAdvice(decodeNcclVersionCode(22809), nullptr).find("NCCL_NET_PLUGIN_REF_COUNT=1"),
            std::string::npos);
  EXPECT_FALSE(ncclReloadAdvice(decodeNcclVersionCode(22703), "0").empty());
  EXPECT_FALSE(ncclReloadAdvice(decodeNcclVersionCode(22907), "").empty());
  EXPECT_TRUE(ncclReloadAdvice(decodeNcclVersionCode(22809), "1").empty());
  EXPECT_TRUE(ncclReloadAdvice(decodeNcclVersionCode(22605), nullptr).empty());
  EXPECT_TRUE(ncclReloadAdvice(decodeNcclVersionCode(23007), nullptr).empty());
  EXPECT_TRUE(ncclReloadAdvice(NcclVersion(), nullptr).empty());
}

}  // namespace
}  // namespace mesh
