// SPDX-License-Identifier: Apache-2.0
/*
 * NCCL network plugin ABI, version 10 (NCCL 2.26+ loads it as "ncclNetPlugin_v10").
 * Written for nccl-mesh from NCCL's published plugin interface; checked field by field
 * against NCCL's own net_v10.h (2.26.2 and later). Offsets pinned with static_assert
 * (LP64).
 *
 * What changed from v9 (the properties are unchanged):
 *  - init also receives NCCL's profiler callback;
 *  - connect receives a per-communicator config (traffic class) as its SECOND argument,
 *    before the handle; NCCL may pass NULL (its GPUDirect probe does);
 *  - isend and irecv receive profiler handles (phandle / phandles) before the request.
 */
#ifndef NCCL_MESH_ABI_NET_V10_H_
#define NCCL_MESH_ABI_NET_V10_H_

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "net_v9.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a plugin reports network events to NCCL's profiler plugin. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                               int64_t pluginId, void* extData);

/* trafficClass when the communicator's config leaves it unset: the plugin's default. */
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)

typedef struct {
  int trafficClass;  // plugin-specific (RoCE: the GRH traffic class), or _UNDEF
} ncclNetCommConfig_v10_t;

typedef ncclNetDeviceHandle_v9_t ncclNetDeviceHandle_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;  // same layout in NCCL

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v10_t** recvDevComm);
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
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

#ifdef __cplusplus
}  // extern "C"

#if defined(__LP64__)
static_assert(sizeof(ncclNetCommConfig_v10_t) == 4, "v10 comm config size");
static_assert(sizeof(ncclNetProperties_v10_t) == 104, "v10 properties size");
static_assert(offsetof(ncclNetProperties_v10_t, maxP2pBytes) == 88, "v10 maxP2pBytes");
static_assert(sizeof(ncclNet_v10_t) == 20 * sizeof(void*), "v10 function table: name + 19 entries");
static_assert(offsetof(ncclNet_v10_t, init) == 1 * 8, "v10 init");
static_assert(offsetof(ncclNet_v10_t, connect) == 5 * 8, "v10 connect");
static_assert(offsetof(ncclNet_v10_t, isend) == 10 * 8, "v10 isend");
static_assert(offsetof(ncclNet_v10_t, irecv) == 11 * 8, "v10 irecv");
static_assert(offsetof(ncclNet_v10_t, test) == 13 * 8, "v10 test");
static_assert(offsetof(ncclNet_v10_t, makeVDevice) == 19 * 8, "v10 makeVDevice");
#endif
#endif  // __cplusplus

#endif  // NCCL_MESH_ABI_NET_V10_H_
