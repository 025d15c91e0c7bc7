// SPDX-License-Identifier: Apache-2.0
// Moving data through the plugin as NCCL does: registered host buffers, isend/irecv
// (grouped receives of up to 8 tagged buffers), test() polling, and the checks.
//  - isend and irecv may return a NULL request ("not yet": the receiver has not posted,
//    or the comm is not ready); the Engine retries them while it keeps testing the rest.
//  - Requests on one comm are posted in the order given (NCCL matches sends to receives
//    in posting order) and at most `window` (<= 32) are outstanding per comm.
//  - test() may be polled in a shuffled order (completions must not depend on it).
// Owns: page-aligned host buffers and the data patterns every check compares against.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "context.h"

namespace e2e {

constexpr int kMaxGroup = 8;      // NCCL's IB transport uses maxRecvs 8
constexpr int kMaxRequests = 32;  // per comm

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t size);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr, o.size_ = 0; }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// regMr(comm, buf, size, NCCL_PTR_HOST) / deregMr, failures thrown with `label`.
void* regHost(Context& ctx, void* comm, const HostBuffer& buf, const std::string& label);
void deregHost(Context& ctx, void* comm, void* mhandle, const std::string& label);

struct Op {
  bool send = true;
  void* comm = nullptr;
  int n = 1;                        // buffers (sends: 1)
  void* data[kMaxGroup] = {};
  int sizes[kMaxGroup] = {};        // send: bytes; recv: capacity of each buffer
  int tags[kMaxGroup] = {};
  void* mh[kMaxGroup] = {};
  std::string label;                // names rank, peer, comm, phase, index
  // Filled in by the Engine.
  void* request = nullptr;
  bool posted = false;
  bool done = false;
  int got[kMaxGroup] = {};          // sizes reported by test(); -1: not written
  long postTries = 0;
  Clock::time_point postedAt, doneAt;
};

Op sendOp(void* comm, void* data, int size, int tag, void* mh, std::string label);
Op recvOp(void* comm, void* data, int size, int tag, void* mh, std::string label);

struct EngineOptions {
  int window = kMaxRequests;  // outstanding requests per comm
  bool shuffleTests = false;  // poll test() in a random order each sweep
  int idleSleepUs = 50;       // after a sweep that moved nothing: sleep; 0: sched_yield()
                              // (spin as NCCL's proxy does, for benchmarks)
};

class Engine {
 public:
  Engine(Context& ctx, unsigned seed) : ctx_(ctx), rng_(seed) {}
  // Posts and completes every op. Throws Failure on any error or at the deadline (the
  // message lists the ops not done yet).
  void run(std::vector<Op>& ops, const Deadline& deadline, const EngineOptions& opt = {});
  // Tries to post every op (no test() calls) until all are posted or `deadline`;
  // returns how many were posted. For tests that close comms with requests in flight.
  // With `errors` non-NULL an isend/irecv error stops posting on that comm and is
  // counted there (the peer may be closing); otherwise it is thrown.
  size_t postOnly(std::vector<Op>& ops, const Deadline& deadline, int* errors = nullptr);
  std::mt19937& rng() { return rng_; }

 private:
  // 1 posted, 0 not yet (NULL request), -1 error (thrown unless `rc` is non-NULL).
  int tryPost(Op& op, ncclResult_t* rc = nullptr);
  bool tryComplete(Op& op);
  void checkFlush(Op& op);
  std::string pendingSummary(const std::vector<Op>& ops) const;

  Context& ctx_;
  std::mt19937 rng_;
  long flushes_ = 0;  // GPUDirect-style flushes issued and completed

 public:
  long flushes() const { return flushes_; }
};

// --- phases: ops run together, then every receive buffer checked ----------------------------

constexpr uint8_t kCanary = 0xEE;  // receive buffers are filled with it before posting

// Sends and receives in posting order, and what each receive buffer must hold afterwards.
// A receive of `capacity` bytes whose peer sends `size` bytes must report min(size,
// capacity) (larger sends are truncated, as NCCL's IB transport does), hold the peer's
// pattern there, and keep the canary from there to capacity + guard: nothing written past
// what landed, nor past the posted buffer.
struct Phase {
  struct Expect {
    size_t op;
    int idx;          // buffer within a grouped receive
    uint8_t* data;
    int capacity;
    int size;         // bytes the peer sends into it
    uint64_t seed;
    int guard;        // canary bytes after the posted capacity
  };
  std::string name;
  std::vector<Op> ops;
  std::vector<Expect> expects;
  size_t bytes = 0;   // sent by this rank

  // Fills data with the pattern of `seed` and appends the isend.
  void addSend(void* comm, uint8_t* data, int size, int tag, void* mh, uint64_t seed, std::string label);
  // A grouped receive of n buffers: capacities[i] bytes at data[i] with tags[i]; the peer
  // sends sizes[i] bytes from patterns seeds[i]. The canary covers capacity + guard bytes.
  void addRecv(void* comm, int n, uint8_t* const* data, const int* capacities, const int* tags, void* mh,
               const int* sizes, const uint64_t* seeds, std::string label, int guard = 0);

  // One side of a shuffled group: kMaxGroup buffers `stride` bytes apart from `at`, and the
  // pattern of the message of each tag slot (the send side's own, the receive side's peer's).
  struct GroupSide {
    void* comm;
    uint8_t* at;
    void* mh;
    size_t stride;
    uint64_t seeds[kMaxGroup];
  };
  // A grouped receive of the kMaxGroup tags firstTag.. (each buffer `capacity` bytes, the
  // tags in a shuffled buffer order) and this side's kMaxGroup sends of the same tags, issued
  // in another shuffled order (both from `rng`); tag firstTag + s carries sizes[s] bytes.
  // Returns the tags in the order the sends are issued.
  std::vector<int> addShuffledGroup(std::mt19937& rng, int firstTag, const int* sizes, int capacity,
                                    const GroupSide& send, const GroupSide& recv,
                                    const std::function<std::string(int slot)>& sendLabel,
                                    const std::string& recvLabel, int guard = 0);
};

// Runs a phase through `engine` and checks every receive (reported size, contents, the
// canary after them); the phase is named "<scenario>: <phase name>" while it runs.
// Returns its seconds.
double runPhase(Context& ctx, Engine& engine, Phase& phase, bool shuffle);

// --- data patterns ------------------------------------------------------------------------

// A seed that differs for every (source rank, destination rank, a, b, c).
uint64_t patternSeed(int src, int dst, uint64_t a, uint64_t b, uint64_t c);
void fillPattern(void* data, size_t size, uint64_t seed);
// Empty when data matches; otherwise "N of M bytes differ, first at offset X (expected
// 0x.., got 0x..)".
std::string checkPattern(const void* data, size_t size, uint64_t seed);
// Empty when every byte of [data, data+size) is `value`; otherwise the first offset.
std::string checkFill(const void* data, size_t size, uint8_t value);

// One request, posted directly (the Engine forgets requests once done): retries while the
// plugin returns a NULL request ("not yet"), for at most 30 s; errors are thrown with
// `label`. postSend needs the peer's receive to be posted.
void* postRecv(Context& ctx, void* comm, void* data, size_t size, int tag, void* mh, const std::string& label);
// The same for a grouped receive of n buffers.
void* postRecvGroup(Context& ctx, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                    const std::string& label);
void* postSend(Context& ctx, void* comm, void* data, size_t size, int tag, void* mh, const std::string& label);

// test() on `req` (n buffers) until done, 200 us between calls; returns the sizes. An error
// is thrown with `label`; not done after 60 s (or the scenario's deadline) fails.
std::vector<size_t> waitDone(Context& ctx, void* req, int n, const std::string& label);

// One 8-byte message each way on (send, recv) with a data check; a connection health
// probe. Registers and deregisters its own buffers.
void exchangeSmall(Context& ctx, int peer, void* sendComm, void* recvComm, uint64_t round,
                   const std::string& label);

}  // namespace e2e
