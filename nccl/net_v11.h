// SPDX-License-Identifier: Apache-2.0
/*
 * NCCL network plugin ABI, version 11 (NCCL 2.28+ loads it as "ncclNetPlugin_v11").
 * Written for nccl-mesh from NCCL's published plugin interface; checked field by field
 * against NCCL's own net_v11.h (2.28.3 and later). Offsets pinned with static_assert
 * (LP64).
 *
 * What changed from v10:
 *  - init is called once PER COMMUNICATOR: init(&ctx, commId, config, logger, profiler)
 *    returns a context, and finalize(ctx) ends it; the config (traffic class) moved from
 *    connect to init;
 *  - listen and connect take that context as their FIRST argument;
 *  - properties gain maxMultiRequestSize (after maxCollBytes);
 *  - setNetAttr(ctx, attr) passes NCCL's per-communicator concurrency hints; NCCL accepts
 *    NULL there.
 */
#ifndef NCCL_MESH_ABI_NET_V11_H_
#define NCCL_MESH_ABI_NET_V11_H_

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "net_v10.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;  // {int trafficClass}
typedef ncclNetDeviceHandle_v10_t ncclNetDeviceHandle_v11_t;
typedef ncclNetVDeviceProps_v10_t ncclNetVDeviceProps_v11_t;

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
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;  // requests one multi-request may carry; 1: no multi-requests
} ncclNetProperties_v11_t;

/* Value of every ncclNetAttr_v11_t field NCCL leaves unset. */
#define NCCL_NET_ATTR_UNDEF (-1)

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;     // bit mask of NCCL functions
  uint32_t algo;   // bit mask of algorithms
  uint32_t proto;  // bit mask of protocols
} ncclNetAttr_v11_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v11_t** recvDevComm);
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
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

#ifdef __cplusplus
}  // extern "C"

#if defined(__LP64__)
static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties size");
static_assert(offsetof(ncclNetProperties_v11_t, forceFlush) == 32, "v11 forceFlush");
static_assert(offsetof(ncclNetProperties_v11_t, speed) == 36, "v11 speed");
static_assert(offsetof(ncclNetProperties_v11_t, netDeviceVersion) == 60, "v11 netDeviceVersion");
static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64, "v11 vProps");
static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88, "v11 maxP2pBytes");
static_assert(offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96, "v11 maxCollBytes");
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 maxMultiRequestSize");
static_assert(sizeof(ncclNetCommAttr_v11_t) == 16, "v11 comm attr size");
static_assert(sizeof(ncclNetAttr_v11_t) == 44, "v11 net attr size");
static_assert(offsetof(ncclNetAttr_v11_t, recvCommAttr) == 16, "v11 recvCommAttr");
static_assert(offsetof(ncclNetAttr_v11_t, op) == 32, "v11 op");
static_assert(offsetof(ncclNetAttr_v11_t, proto) == 40, "v11 proto");
static_assert(sizeof(ncclNet_v11_t) == 22 * sizeof(void*), "v11 function table: name + 21 entries");
static_assert(offsetof(ncclNet_v11_t, init) == 1 * 8, "v11 init");
static_assert(offsetof(ncclNet_v11_t, listen) == 4 * 8, "v11 listen");
static_assert(offsetof(ncclNet_v11_t, connect) == 5 * 8, "v11 connect");
static_assert(offsetof(ncclNet_v11_t, isend) == 10 * 8, "v11 isend");
static_assert(offsetof(ncclNet_v11_t, test) == 13 * 8, "v11 test");
static_assert(offsetof(ncclNet_v11_t, makeVDevice) == 19 * 8, "v11 makeVDevice");
static_assert(offsetof(ncclNet_v11_t, finalize) == 20 * 8, "v11 finalize");
static_assert(offsetof(ncclNet_v11_t, setNetAttr) == 21 * 8, "v11 setNetAttr");
#endif
#endif  // __cplusplus

#endif  // NCCL_MESH_ABI_NET_V11_H_
