// SPDX-License-Identifier: Apache-2.0
// abi_layout: the v8 structs NCCL reads, compiled from nccl/net_v8.h alone. The header
// pins these offsets with static_assert too; this test repeats them where ctest reports
// them, and checks them again at run time.
#include <gtest/gtest.h>

#include <cstddef>

#include "net_v8.h"

#if defined(__x86_64__)
static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties: 64 bytes on x86-64");
static_assert(offsetof(ncclNetProperties_v8_t, ptrSupport) == 24, "ptrSupport at 24");
static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28, "regIsGlobal at 28");
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "speed at 32");
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40, "latency at 40");
static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48, "maxRecvs at 48");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "netDeviceVersion at 56");
#endif

namespace {

#if defined(__LP64__)
TEST(AbiLayout, PropertiesV8) {
  EXPECT_EQ(sizeof(ncclNetProperties_v8_t), 64u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, name), 0u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, pciPath), 8u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, guid), 16u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, ptrSupport), 24u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, regIsGlobal), 28u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, speed), 32u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, port), 36u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, latency), 40u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, maxComms), 44u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, maxRecvs), 48u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, netDeviceType), 52u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, netDeviceVersion), 56u);
  EXPECT_EQ(sizeof(ncclNetDeviceType), 4u);
  EXPECT_EQ(sizeof(float), 4u);
}

TEST(AbiLayout, DeviceHandleV8) {
  EXPECT_EQ(sizeof(ncclNetDeviceHandle_v8_t), 32u);
  EXPECT_EQ(offsetof(ncclNetDeviceHandle_v8_t, netDeviceType), 0u);
  EXPECT_EQ(offsetof(ncclNetDeviceHandle_v8_t, netDeviceVersion), 4u);
  EXPECT_EQ(offsetof(ncclNetDeviceHandle_v8_t, handle), 8u);
  EXPECT_EQ(offsetof(ncclNetDeviceHandle_v8_t, size), 16u);
  EXPECT_EQ(offsetof(ncclNetDeviceHandle_v8_t, needsProxyProgress), 24u);
}

// NCCL calls through the table by position: name, then 18 entry points in DESIGN.md's order.
TEST(AbiLayout, FunctionTableV8) {
  constexpr size_t kPtr = sizeof(void*);
  EXPECT_EQ(sizeof(ncclNet_v8_t), 19 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, name), 0 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, init), 1 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, devices), 2 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, getProperties), 3 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, listen), 4 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, connect), 5 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, accept), 6 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, regMr), 7 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, regMrDmaBuf), 8 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, deregMr), 9 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, isend), 10 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, irecv), 11 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, iflush), 12 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, test), 13 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, closeSend), 14 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, closeRecv), 15 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, closeListen), 16 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, getDeviceMr), 17 * kPtr);
  EXPECT_EQ(offsetof(ncclNet_v8_t, irecvConsumed), 18 * kPtr);
}
#endif

// Values NCCL and the plugin exchange as plain integers.
TEST(AbiLayout, Constants) {
  EXPECT_EQ(NCCL_NET_HANDLE_MAXSIZE, 128);
  EXPECT_EQ(NCCL_PTR_HOST, 1);
  EXPECT_EQ(NCCL_PTR_CUDA, 2);
  EXPECT_EQ(NCCL_PTR_DMABUF, 4);
  EXPECT_EQ(NCCL_NET_MAX_REQUESTS, 32);
  EXPECT_EQ(NCCL_NET_DEVICE_HOST, 0);
  EXPECT_EQ(ncclSuccess, 0);
  EXPECT_EQ(ncclSystemError, 2);
  EXPECT_EQ(ncclInternalError, 3);
  EXPECT_EQ(ncclInvalidArgument, 4);
  EXPECT_EQ(ncclInvalidUsage, 5);
  EXPECT_EQ(ncclRemoteError, 6);
  EXPECT_EQ(NCCL_LOG_WARN, 2);
  EXPECT_EQ(NCCL_LOG_INFO, 3);
  EXPECT_EQ(NCCL_LOG_TRACE, 5);
}

}  // namespace
