// SPDX-License-Identifier: Apache-2.0
// abi_versions_layout: the v9, v10, v11 and v12 structs NCCL reads, compiled from nccl/
// alone. The headers pin the same offsets with static_assert; this test repeats every one
// where ctest reports it. Offsets are NCCL's (src/include/plugin/net/net_v9.h, net_v10.h,
// net_v11.h, and v2.30.7's net_v12.h, measured by compiling NCCL's own header) on LP64.
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>

#include "net_v12.h"  // v11, v10, v9 and v8 through it

namespace {

constexpr size_t kPtr = sizeof(void*);

#if defined(__LP64__)

// v9, v10 (same struct) and v11 share everything up to maxCollBytes.
template <typename Props>
void expectWideProperties() {
  EXPECT_EQ(offsetof(Props, name), 0u);
  EXPECT_EQ(offsetof(Props, pciPath), 8u);
  EXPECT_EQ(offsetof(Props, guid), 16u);
  EXPECT_EQ(offsetof(Props, ptrSupport), 24u);
  EXPECT_EQ(offsetof(Props, regIsGlobal), 28u);
  EXPECT_EQ(offsetof(Props, forceFlush), 32u);
  EXPECT_EQ(offsetof(Props, speed), 36u);
  EXPECT_EQ(offsetof(Props, port), 40u);
  EXPECT_EQ(offsetof(Props, latency), 44u);
  EXPECT_EQ(offsetof(Props, maxComms), 48u);
  EXPECT_EQ(offsetof(Props, maxRecvs), 52u);
  EXPECT_EQ(offsetof(Props, netDeviceType), 56u);
  EXPECT_EQ(offsetof(Props, netDeviceVersion), 60u);
  EXPECT_EQ(offsetof(Props, vProps), 64u);
  EXPECT_EQ(offsetof(Props, vProps) + offsetof(ncclNetVDeviceProps_v9_t, devs), 68u);
  EXPECT_EQ(offsetof(Props, maxP2pBytes), 88u);
  EXPECT_EQ(offsetof(Props, maxCollBytes), 96u);
}

TEST(AbiVersionsLayout, VDevicePropsV9) {
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v9_t), 20u);
  EXPECT_EQ(offsetof(ncclNetVDeviceProps_v9_t, ndevs), 0u);
  EXPECT_EQ(offsetof(ncclNetVDeviceProps_v9_t, devs), 4u);
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v9_t::devs) / sizeof(int), 4u);
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v11_t), 20u);
}

TEST(AbiVersionsLayout, PropertiesV9) {
  EXPECT_EQ(sizeof(ncclNetProperties_v9_t), 104u);
  expectWideProperties<ncclNetProperties_v9_t>();
}

TEST(AbiVersionsLayout, PropertiesV10) {
  EXPECT_EQ(sizeof(ncclNetProperties_v10_t), 104u);
  expectWideProperties<ncclNetProperties_v10_t>();
}

TEST(AbiVersionsLayout, PropertiesV11) {
  EXPECT_EQ(sizeof(ncclNetProperties_v11_t), 112u);
  expectWideProperties<ncclNetProperties_v11_t>();
  EXPECT_EQ(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize), 104u);
}

// v12 (NCCL 2.30): vProps holds 8 devices, so everything after it moves by 16 bytes, and
// railId/planeId (int16_t) close the struct.
TEST(AbiVersionsLayout, PropertiesV12) {
  using P = ncclNetProperties_v12_t;
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v12_t), 36u);
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v12_t::devs) / sizeof(int), 8u);
  EXPECT_EQ(offsetof(P, name), 0u);
  EXPECT_EQ(offsetof(P, pciPath), 8u);
  EXPECT_EQ(offsetof(P, guid), 16u);
  EXPECT_EQ(offsetof(P, ptrSupport), 24u);
  EXPECT_EQ(offsetof(P, regIsGlobal), 28u);
  EXPECT_EQ(offsetof(P, forceFlush), 32u);
  EXPECT_EQ(offsetof(P, speed), 36u);
  EXPECT_EQ(offsetof(P, port), 40u);
  EXPECT_EQ(offsetof(P, latency), 44u);
  EXPECT_EQ(offsetof(P, maxComms), 48u);
  EXPECT_EQ(offsetof(P, maxRecvs), 52u);
  EXPECT_EQ(offsetof(P, netDeviceType), 56u);
  EXPECT_EQ(offsetof(P, netDeviceVersion), 60u);
  EXPECT_EQ(offsetof(P, vProps), 64u);
  EXPECT_EQ(offsetof(P, vProps) + offsetof(ncclNetVDeviceProps_v12_t, devs), 68u);
  EXPECT_EQ(offsetof(P, maxP2pBytes), 104u);
  EXPECT_EQ(offsetof(P, maxCollBytes), 112u);
  EXPECT_EQ(offsetof(P, maxMultiRequestSize), 120u);
  EXPECT_EQ(offsetof(P, railId), 124u);
  EXPECT_EQ(offsetof(P, planeId), 126u);
  EXPECT_EQ(sizeof(P::railId), 2u);
  EXPECT_EQ(sizeof(P::planeId), 2u);
  EXPECT_EQ(sizeof(P), 128u);
}

// v12: v11's 21 entry points, same order, same signatures but for the v12 structs.
TEST(AbiVersionsLayout, FunctionTableV12) {
  EXPECT_EQ(sizeof(ncclNet_v12_t), 22 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, init), offsetof(ncclNet_v11_t, init));
  EXPECT_EQ(offsetof(ncclNet_v12_t, getProperties), 3 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, listen), 4 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, connect), 5 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, isend), 10 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, irecv), 11 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, test), 13 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, irecvConsumed), 18 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, makeVDevice), 19 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, finalize), 20 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v12_t, setNetAttr), 21 * kPtr);
  using V12Props = ncclResult_t (*)(int, ncclNetProperties_v12_t*);
  using V12VDev = ncclResult_t (*)(int*, ncclNetVDeviceProps_v12_t*);
  static_assert(std::is_same<decltype(ncclNet_v12_t::getProperties), V12Props>::value, "v12 getProperties");
  static_assert(std::is_same<decltype(ncclNet_v12_t::makeVDevice), V12VDev>::value, "v12 makeVDevice");
  static_assert(std::is_same<decltype(ncclNet_v12_t::init), decltype(ncclNet_v11_t::init)>::value, "v12 init");
  static_assert(std::is_same<decltype(ncclNet_v12_t::isend), decltype(ncclNet_v11_t::isend)>::value, "v12 isend");
  static_assert(std::is_same<decltype(ncclNet_v12_t::test), decltype(ncclNet_v11_t::test)>::value, "v12 test");
  EXPECT_EQ(sizeof(ncclNetCommConfig_v12_t), 4u);
  EXPECT_EQ(sizeof(ncclNetAttr_v12_t), 44u);
}

TEST(AbiVersionsLayout, DeviceHandlesAreV8s) {
  EXPECT_EQ(sizeof(ncclNetDeviceHandle_v9_t), 32u);
  EXPECT_EQ(sizeof(ncclNetDeviceHandle_v10_t), 32u);
  EXPECT_EQ(sizeof(ncclNetDeviceHandle_v11_t), 32u);
}

TEST(AbiVersionsLayout, CommConfigAndNetAttr) {
  EXPECT_EQ(sizeof(ncclNetCommConfig_v10_t), 4u);
  EXPECT_EQ(offsetof(ncclNetCommConfig_v10_t, trafficClass), 0u);
  EXPECT_EQ(sizeof(ncclNetCommConfig_v11_t), 4u);
  EXPECT_EQ(sizeof(ncclNetCommAttr_v11_t), 16u);
  EXPECT_EQ(offsetof(ncclNetCommAttr_v11_t, maxConcurrentPeers), 0u);
  EXPECT_EQ(offsetof(ncclNetCommAttr_v11_t, minConcurrentPeers), 4u);
  EXPECT_EQ(offsetof(ncclNetCommAttr_v11_t, maxFlowsPerPeer), 8u);
  EXPECT_EQ(offsetof(ncclNetCommAttr_v11_t, minFlowsPerPeer), 12u);
  EXPECT_EQ(sizeof(ncclNetAttr_v11_t), 44u);
  EXPECT_EQ(offsetof(ncclNetAttr_v11_t, sendCommAttr), 0u);
  EXPECT_EQ(offsetof(ncclNetAttr_v11_t, recvCommAttr), 16u);
  EXPECT_EQ(offsetof(ncclNetAttr_v11_t, op), 32u);
  EXPECT_EQ(offsetof(ncclNetAttr_v11_t, algo), 36u);
  EXPECT_EQ(offsetof(ncclNetAttr_v11_t, proto), 40u);
}

// v9 and v10 tables: name, v8's 18 entry points in v8's order, then makeVDevice.
template <typename Table>
void expectV9ShapedTable() {
  EXPECT_EQ(sizeof(Table), 20 * kPtr);
  EXPECT_EQ(offsetof(Table, name), 0 * kPtr);
  EXPECT_EQ(offsetof(Table, init), 1 * kPtr);
  EXPECT_EQ(offsetof(Table, devices), 2 * kPtr);
  EXPECT_EQ(offsetof(Table, getProperties), 3 * kPtr);
  EXPECT_EQ(offsetof(Table, listen), 4 * kPtr);
  EXPECT_EQ(offsetof(Table, connect), 5 * kPtr);
  EXPECT_EQ(offsetof(Table, accept), 6 * kPtr);
  EXPECT_EQ(offsetof(Table, regMr), 7 * kPtr);
  EXPECT_EQ(offsetof(Table, regMrDmaBuf), 8 * kPtr);
  EXPECT_EQ(offsetof(Table, deregMr), 9 * kPtr);
  EXPECT_EQ(offsetof(Table, isend), 10 * kPtr);
  EXPECT_EQ(offsetof(Table, irecv), 11 * kPtr);
  EXPECT_EQ(offsetof(Table, iflush), 12 * kPtr);
  EXPECT_EQ(offsetof(Table, test), 13 * kPtr);
  EXPECT_EQ(offsetof(Table, closeSend), 14 * kPtr);
  EXPECT_EQ(offsetof(Table, closeRecv), 15 * kPtr);
  EXPECT_EQ(offsetof(Table, closeListen), 16 * kPtr);
  EXPECT_EQ(offsetof(Table, getDeviceMr), 17 * kPtr);
  EXPECT_EQ(offsetof(Table, irecvConsumed), 18 * kPtr);
  EXPECT_EQ(offsetof(Table, makeVDevice), 19 * kPtr);
}

TEST(AbiVersionsLayout, FunctionTableV9) { expectV9ShapedTable<ncclNet_v9_t>(); }
TEST(AbiVersionsLayout, FunctionTableV10) { expectV9ShapedTable<ncclNet_v10_t>(); }

TEST(AbiVersionsLayout, FunctionTableV11) {
  EXPECT_EQ(sizeof(ncclNet_v11_t), 22 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, init), 1 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, devices), 2 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, getProperties), 3 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, listen), 4 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, connect), 5 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, accept), 6 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, isend), 10 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, irecv), 11 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, test), 13 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, irecvConsumed), 18 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, makeVDevice), 19 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, finalize), 20 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v11_t, setNetAttr), 21 * kPtr);
}

#endif  // __LP64__

// The signatures that changed, checked by type: a header that got one wrong (v9's test
// sizes are still int; v10's config comes before the handle) does not compile.
TEST(AbiVersionsLayout, Signatures) {
  using V9Isend = ncclResult_t (*)(void*, void*, size_t, int, void*, void**);
  using V9Irecv = ncclResult_t (*)(void*, int, void**, size_t*, int*, void**, void**);
  using IntSizes = ncclResult_t (*)(void*, int*, int*);
  using V10Connect = ncclResult_t (*)(int, ncclNetCommConfig_v10_t*, void*, void**, ncclNetDeviceHandle_v10_t**);
  using V10Isend = ncclResult_t (*)(void*, void*, size_t, int, void*, void*, void**);
  using V11Init = ncclResult_t (*)(void**, uint64_t, ncclNetCommConfig_v11_t*, ncclDebugLogger_t,
                                   ncclProfilerCallback_t);
  using V11Listen = ncclResult_t (*)(void*, int, void*, void**);
  static_assert(std::is_same<decltype(ncclNet_v9_t::isend), V9Isend>::value, "v9 isend");
  static_assert(std::is_same<decltype(ncclNet_v9_t::irecv), V9Irecv>::value, "v9 irecv");
  static_assert(std::is_same<decltype(ncclNet_v9_t::test), IntSizes>::value, "v9 test");
  static_assert(std::is_same<decltype(ncclNet_v11_t::test), IntSizes>::value, "v11 test");
  static_assert(std::is_same<decltype(ncclNet_v10_t::connect), V10Connect>::value, "v10 connect");
  static_assert(std::is_same<decltype(ncclNet_v10_t::isend), V10Isend>::value, "v10 isend");
  static_assert(std::is_same<decltype(ncclNet_v11_t::isend), V10Isend>::value, "v11 isend");
  static_assert(std::is_same<decltype(ncclNet_v11_t::init), V11Init>::value, "v11 init");
  static_assert(std::is_same<decltype(ncclNet_v11_t::listen), V11Listen>::value, "v11 listen");
  SUCCEED();
}

TEST(AbiVersionsLayout, Constants) {
  EXPECT_EQ(NCCL_NET_MAX_DEVS_PER_NIC, 4);
  EXPECT_EQ(NCCL_MAX_NET_SIZE_BYTES, 1ULL << 40);
  EXPECT_EQ(NCCL_NET_V8_MAX_SIZE, 1ULL << 30);
  EXPECT_EQ(NCCL_NET_TRAFFIC_CLASS_UNDEF, -1);
  EXPECT_EQ(NCCL_NET_ATTR_UNDEF, -1);
  EXPECT_EQ(NCCL_NET_MAX_DEVS_PER_NIC_V12, 8);
  EXPECT_EQ(NCCL_NET_ID_UNDEF, -1);
}

}  // namespace
