// SPDX-License-Identifier: Apache-2.0
/*
 * NCCL network plugin ABI, version 8 (NCCL 2.20+ loads it as "ncclNetPlugin_v8").
 * Written for nccl-mesh from the published ABI facts. Every offset NCCL relies on is
 * pinned below with static_assert (x86-64 / aarch64 LP64).
 */
#ifndef NCCL_MESH_ABI_NET_V8_H_
#define NCCL_MESH_ABI_NET_V8_H_

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;

typedef struct {
  char* name;          // used mostly for logging
  char* pciPath;       // path to the PCI device in /sys
  uint64_t guid;       // unique identifier of the NIC chip
  int ptrSupport;      // NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF
  int regIsGlobal;     // a registration is valid for every comm of the device
  int speed;           // port speed in Mbps
  int port;            // port number
  float latency;       // network latency in microseconds
  int maxComms;        // maximum number of comms we can create
  int maxRecvs;        // maximum number of grouped receives
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

#ifdef __cplusplus
}  // extern "C"

#if defined(__LP64__)
static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties size");
static_assert(offsetof(ncclNetProperties_v8_t, name) == 0, "v8 name");
static_assert(offsetof(ncclNetProperties_v8_t, pciPath) == 8, "v8 pciPath");
static_assert(offsetof(ncclNetProperties_v8_t, guid) == 16, "v8 guid");
static_assert(offsetof(ncclNetProperties_v8_t, ptrSupport) == 24, "v8 ptrSupport");
static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28, "v8 regIsGlobal");
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "v8 speed");
static_assert(offsetof(ncclNetProperties_v8_t, port) == 36, "v8 port");
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40, "v8 latency");
static_assert(offsetof(ncclNetProperties_v8_t, maxComms) == 44, "v8 maxComms");
static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48, "v8 maxRecvs");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceType) == 52, "v8 netDeviceType");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 netDeviceVersion");
static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32, "v8 device handle size");
static_assert(offsetof(ncclNetDeviceHandle_v8_t, handle) == 8, "v8 device handle");
static_assert(offsetof(ncclNetDeviceHandle_v8_t, size) == 16, "v8 device handle size field");
static_assert(offsetof(ncclNetDeviceHandle_v8_t, needsProxyProgress) == 24, "v8 proxy progress");
static_assert(sizeof(ncclNet_v8_t) == 19 * sizeof(void*), "v8 function table: name + 18 entries");
static_assert(offsetof(ncclNet_v8_t, init) == 8, "v8 init");
static_assert(offsetof(ncclNet_v8_t, regMr) == 7 * 8, "v8 regMr");
static_assert(offsetof(ncclNet_v8_t, isend) == 10 * 8, "v8 isend");
static_assert(offsetof(ncclNet_v8_t, test) == 13 * 8, "v8 test");
static_assert(offsetof(ncclNet_v8_t, closeListen) == 16 * 8, "v8 closeListen");
static_assert(offsetof(ncclNet_v8_t, irecvConsumed) == 18 * 8, "v8 irecvConsumed");
#endif
#endif  // __cplusplus

#endif  // NCCL_MESH_ABI_NET_V8_H_
