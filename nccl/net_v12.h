// SPDX-License-Identifier: Apache-2.0
/*
 * NCCL network plugin ABI, version 12 (NCCL 2.30 looks for "ncclNetPlugin_v12" first, then
 * v11, v10, ...). Written for nccl-mesh from NCCL's published plugin interface; every
 * offset below was checked against NCCL's own v2.30.7 headers (plugins/net/example/nccl/
 * net_v12.h and src/include/plugin/net/net_v12.h, compiled and measured on x86-64) and is
 * pinned with static_assert (LP64).
 *
 * What changed from v11 (the 21 entry points keep their order and signatures):
 *  - the virtual-device list holds up to 8 physical devices (v11: 4), so vProps grows from
 *    20 to 36 bytes and everything after it moves by 16: maxP2pBytes 104, maxCollBytes
 *    112, maxMultiRequestSize 120;
 *  - properties end with two int16_t: railId (124) and planeId (126); sizeof 128.
 *    NCCL_NET_ID_UNDEF (-1) makes NCCL ignore them (its shims for older plugins report
 *    that). NCCL 2.30's graph search keeps a channel on one rail unless cross-NIC is
 *    allowed, and never connects devices of different planes;
 *  - makeVDevice takes the 8-entry vProps.
 * NCCL 2.30 uses a v12 table as its internal ncclNet_t directly, without a shim.
 */
#ifndef NCCL_MESH_ABI_NET_V12_H_
#define NCCL_MESH_ABI_NET_V12_H_

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "net_v11.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Physical devices one v12 virtual NIC may fuse. */
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8

/* railId / planeId value NCCL ignores. */
#define NCCL_NET_ID_UNDEF (-1)

typedef ncclNetCommConfig_v11_t ncclNetCommConfig_v12_t;  // {int trafficClass}
typedef ncclNetDeviceHandle_v11_t ncclNetDeviceHandle_v12_t;
typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;           // Mbps
  int port;
  float latency;       // microseconds
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;      // devices NCCL may pair across nodes; NCCL_NET_ID_UNDEF: ignored
  int16_t planeId;     // separate fabrics NCCL never connects; NCCL_NET_ID_UNDEF: ignored
} ncclNetProperties_v12_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

#ifdef __cplusplus
}  // extern "C"

#if defined(__LP64__)
static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36, "v12 vProps size");
static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties size");
static_assert(offsetof(ncclNetProperties_v12_t, forceFlush) == 32, "v12 forceFlush");
static_assert(offsetof(ncclNetProperties_v12_t, netDeviceVersion) == 60, "v12 netDeviceVersion");
static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "v12 vProps");
static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 maxP2pBytes");
static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "v12 maxCollBytes");
static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120, "v12 maxMultiRequestSize");
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 railId");
static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "v12 planeId");
static_assert(sizeof(ncclNet_v12_t) == 22 * sizeof(void*), "v12 function table: name + 21 entries");
static_assert(offsetof(ncclNet_v12_t, getProperties) == 3 * 8, "v12 getProperties");
static_assert(offsetof(ncclNet_v12_t, makeVDevice) == 19 * 8, "v12 makeVDevice");
static_assert(offsetof(ncclNet_v12_t, finalize) == 20 * 8, "v12 finalize");
static_assert(offsetof(ncclNet_v12_t, setNetAttr) == 21 * 8, "v12 setNetAttr");
#endif
#endif  // __cplusplus

#endif  // NCCL_MESH_ABI_NET_V12_H_
