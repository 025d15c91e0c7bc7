// SPDX-License-Identifier: Apache-2.0
/*
 * NCCL network plugin ABI, version 9 (NCCL 2.24+ loads it as "ncclNetPlugin_v9").
 * Written for nccl-mesh from NCCL's published plugin interface; checked field by field
 * against NCCL's own net_v9.h (2.24.3 and later). Every offset NCCL relies on is pinned
 * below with static_assert (x86-64 / aarch64 LP64).
 *
 * What changed from v8:
 *  - properties gain forceFlush (after regIsGlobal), vProps, maxP2pBytes, maxCollBytes;
 *  - isend's size and irecv's sizes become size_t (iflush's sizes and test's sizes stay
 *    int);
 *  - makeVDevice (NIC fusion) is appended to the table; NCCL accepts NULL there and then
 *    uses the physical devices as they are.
 */
#ifndef NCCL_MESH_ABI_NET_V9_H_
#define NCCL_MESH_ABI_NET_V9_H_

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "net_v8.h"  // handle size, NCCL_PTR_*, ncclNetDeviceType, the device handle

#ifdef __cplusplus
extern "C" {
#endif

/* Physical devices one virtual NIC may fuse (NCCL: NCCL_NET_MAX_DEVS_PER_NIC_V9/_V11). */
#define NCCL_NET_MAX_DEVS_PER_NIC 4

/* The largest maxP2pBytes / maxCollBytes NCCL accepts (1 TiB); above it, or 0, NCCL fails
 * the connection setup ("net plugin returned invalid value for maxP2pBytes"). */
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40)

/* The largest message NCCL gives a v8 plugin (1 GiB): NCCL's v8 shim rejects larger ones. */
#define NCCL_NET_V8_MAX_SIZE (1ULL << 30)

typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;

/* The physical devices behind one (virtual) device. */
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_v9_t;

typedef struct {
  char* name;          // for logs; NCCL keeps the pointer
  char* pciPath;       // sysfs path of the PCI device (NULL: unknown)
  uint64_t guid;       // identifies the NIC chip across its PCI functions
  int ptrSupport;      // NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF
  int regIsGlobal;     // a registration serves every comm of the device
  int forceFlush;      // NCCL must flush after every receive (data-direct NICs)
  int speed;           // Mbps
  int port;
  float latency;       // microseconds
  int maxComms;
  int maxRecvs;        // grouped receive limit
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;  // a physical device lists itself: {1, {dev}}
  size_t maxP2pBytes;  // largest single isend/irecv, 1..NCCL_MAX_NET_SIZE_BYTES
  size_t maxCollBytes; // same, for collective-network plugins
} ncclNetProperties_v9_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

#ifdef __cplusplus
}  // extern "C"

#if defined(__LP64__)
static_assert(sizeof(ncclNetVDeviceProps_v9_t) == 20, "v9 vProps size");
static_assert(offsetof(ncclNetVDeviceProps_v9_t, devs) == 4, "v9 vProps devs");
static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 properties size");
static_assert(offsetof(ncclNetProperties_v9_t, name) == 0, "v9 name");
static_assert(offsetof(ncclNetProperties_v9_t, pciPath) == 8, "v9 pciPath");
static_assert(offsetof(ncclNetProperties_v9_t, guid) == 16, "v9 guid");
static_assert(offsetof(ncclNetProperties_v9_t, ptrSupport) == 24, "v9 ptrSupport");
static_assert(offsetof(ncclNetProperties_v9_t, regIsGlobal) == 28, "v9 regIsGlobal");
static_assert(offsetof(ncclNetProperties_v9_t, forceFlush) == 32, "v9 forceFlush");
static_assert(offsetof(ncclNetProperties_v9_t, speed) == 36, "v9 speed");
static_assert(offsetof(ncclNetProperties_v9_t, port) == 40, "v9 port");
static_assert(offsetof(ncclNetProperties_v9_t, latency) == 44, "v9 latency");
static_assert(offsetof(ncclNetProperties_v9_t, maxComms) == 48, "v9 maxComms");
static_assert(offsetof(ncclNetProperties_v9_t, maxRecvs) == 52, "v9 maxRecvs");
static_assert(offsetof(ncclNetProperties_v9_t, netDeviceType) == 56, "v9 netDeviceType");
static_assert(offsetof(ncclNetProperties_v9_t, netDeviceVersion) == 60, "v9 netDeviceVersion");
static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 vProps");
static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 maxP2pBytes");
static_assert(offsetof(ncclNetProperties_v9_t, maxCollBytes) == 96, "v9 maxCollBytes");
static_assert(sizeof(ncclNet_v9_t) == 20 * sizeof(void*), "v9 function table: name + 19 entries");
static_assert(offsetof(ncclNet_v9_t, init) == 1 * 8, "v9 init");
static_assert(offsetof(ncclNet_v9_t, connect) == 5 * 8, "v9 connect");
static_assert(offsetof(ncclNet_v9_t, isend) == 10 * 8, "v9 isend");
static_assert(offsetof(ncclNet_v9_t, irecv) == 11 * 8, "v9 irecv");
static_assert(offsetof(ncclNet_v9_t, test) == 13 * 8, "v9 test");
static_assert(offsetof(ncclNet_v9_t, irecvConsumed) == 18 * 8, "v9 irecvConsumed");
static_assert(offsetof(ncclNet_v9_t, makeVDevice) == 19 * 8, "v9 makeVDevice");
#endif
#endif  // __cplusplus

#endif  // NCCL_MESH_ABI_NET_V9_H_
