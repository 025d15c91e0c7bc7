// SPDX-License-Identifier: Apache-2.0
// Streaming traffic for the fault scenarios (link-down, relay-faults): this rank's traffic
// with one peer, one or both directions, up to kStreamWindow isends and irecvs in flight,
// each message pattern-checked and reposted as soon as it completes, until an optional
// message limit. A direction that fails is recorded (code and time) and never touched
// again, so a scenario can keep pumping the healthy ones while it waits for the error.
// Owns: the stream's buffers and their registrations (released by closeStream).
#pragma once

#include <cstdint>

#include "transfer.h"

namespace e2e {

constexpr int kStreamWindow = 2;  // messages in flight per direction

struct Stream {
  int peer = -1;
  void* send = nullptr;  // nullptr: this rank does not send to the peer
  void* recv = nullptr;  // nullptr: this rank does not receive from the peer
  size_t size = 0;
  uint64_t limit = 0;    // messages to post per direction; 0: no limit
  HostBuffer out[kStreamWindow], in[kStreamWindow];
  void* mhOut[kStreamWindow] = {};
  void* mhIn[kStreamWindow] = {};
  void* sreq[kStreamWindow] = {};
  void* rreq[kStreamWindow] = {};
  uint64_t sseqOf[kStreamWindow] = {}, rseqOf[kStreamWindow] = {};
  uint64_t sposted = 0, rposted = 0, sdone = 0, rdone = 0;
  // A failed direction is not touched again (its requests stay in flight until close).
  bool sendFailed = false, recvFailed = false;
  ncclResult_t sendRc = ncclSuccess, recvRc = ncclSuccess;
  Clock::time_point sendFailedAt, recvFailedAt;
  bool failed() const { return sendFailed || recvFailed; }
  // Every direction the stream has failed.
  bool bothFailed() const { return (send == nullptr || sendFailed) && (recv == nullptr || recvFailed); }
  // Messages done in the directions the stream has (the smaller count).
  uint64_t done() const;
};

// Registers kStreamWindow buffers of `size` bytes on each comm given (either may be nullptr).
void openStream(Context& ctx, Stream* s, int peer, void* send, void* recv, size_t size);
// One sweep over the stream. An error on a stream that must stay healthy (`mayFail` false)
// is a test failure; otherwise it marks the direction failed.
void pump(Context& ctx, Stream* s, bool mayFail);
// Deregisters the buffers (requests may still be in flight: close the comms after this).
void closeStream(Context& ctx, Stream* s);

}  // namespace e2e
