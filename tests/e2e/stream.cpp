// SPDX-License-Identifier: Apache-2.0
#include "stream.h"

#include <chrono>

namespace e2e {
namespace {
bool isError(ncclResult_t rc) { return rc != ncclSuccess && rc != ncclInProgress; }
}  // namespace

uint64_t Stream::done() const {
  if (send == nullptr) return rdone;
  if (recv == nullptr) return sdone;
  return sdone < rdone ? sdone : rdone;
}

void openStream(Context& ctx, Stream* s, int peer, void* send, void* recv, size_t size) {
  s->peer = peer;
  s->send = send;
  s->recv = recv;
  s->size = size;
  for (int i = 0; i < kStreamWindow; ++i) {
    if (send != nullptr) s->out[i] = HostBuffer(size);
    if (recv != nullptr) s->in[i] = HostBuffer(size);
    if (send != nullptr) s->mhOut[i] = regHost(ctx, send, s->out[i], format("stream send buffer %d to rank %d", i, peer));
    if (recv != nullptr) s->mhIn[i] = regHost(ctx, recv, s->in[i], format("stream recv buffer %d from rank %d", i, peer));
  }
}

void pump(Context& ctx, Stream* s, bool mayFail) {
  auto failDir = [&](bool sendDir, ncclResult_t rc, const char* call) {
    if (!mayFail) {
      // Poll the stream's other requests for a moment first: when the first error was a
      // flushed WR, the plugin names the WR that caused it once that one completes.
      Clock::time_point until = Clock::now() + std::chrono::milliseconds(500);
      while (Clock::now() < until) {
        for (int i = 0; i < kStreamWindow; ++i) {
          for (void** r : {&s->sreq[i], &s->rreq[i]}) {
            int done = 0;
            size_t got[1];
            if (*r != nullptr && ctx.net->test(*r, &done, got, 1) == ncclSuccess && done) *r = nullptr;
          }
        }
      }
      fail("%s %s rank %d failed with %s, but nothing was done to that path (last WARN: %s)", call,
           sendDir ? "to" : "from", s->peer, resultName(rc), ctx.net.lastWarn().c_str());
    }
    (sendDir ? s->sendFailed : s->recvFailed) = true;
    (sendDir ? s->sendRc : s->recvRc) = rc;
    (sendDir ? s->sendFailedAt : s->recvFailedAt) = Clock::now();
  };
  for (int i = 0; s->send != nullptr && i < kStreamWindow && !s->sendFailed; ++i) {
    if (s->sreq[i] != nullptr) {
      int done = 0;
      size_t got[1];
      ncclResult_t rc = ctx.net->test(s->sreq[i], &done, got, 1);
      if (isError(rc)) return failDir(true, rc, "test() on an isend");
      if (!done) continue;
      s->sreq[i] = nullptr;
      ++s->sdone;
    }
    if (s->sposted % kStreamWindow != static_cast<uint64_t>(i)) continue;  // post in order
    if (s->limit != 0 && s->sposted >= s->limit) continue;
    fillPattern(s->out[i].data(), s->size, patternSeed(ctx.rank, s->peer, s->sposted, s->size, 77));
    void* req = nullptr;
    ncclResult_t rc = ctx.net->isend(s->send, s->out[i].data(), s->size, 1, s->mhOut[i], &req);
    if (isError(rc)) return failDir(true, rc, "isend");
    if (req == nullptr) continue;
    s->sreq[i] = req;
    s->sseqOf[i] = s->sposted++;
  }
  for (int i = 0; s->recv != nullptr && i < kStreamWindow && !s->recvFailed; ++i) {
    if (s->rreq[i] != nullptr) {
      int done = 0;
      size_t got[1] = {0};
      ncclResult_t rc = ctx.net->test(s->rreq[i], &done, got, 1);
      if (isError(rc)) return failDir(false, rc, "test() on an irecv");
      if (!done) continue;
      s->rreq[i] = nullptr;
      if (got[0] != s->size) fail("message %llu from rank %d: %zu bytes, expected %zu",
                                  static_cast<unsigned long long>(s->rseqOf[i]), s->peer, got[0], s->size);
      std::string bad = checkPattern(s->in[i].data(), s->size,
                                     patternSeed(s->peer, ctx.rank, s->rseqOf[i], s->size, 77));
      if (!bad.empty()) fail("message %llu from rank %d corrupt: %s",
                             static_cast<unsigned long long>(s->rseqOf[i]), s->peer, bad.c_str());
      ++s->rdone;
    }
    if (s->rposted % kStreamWindow != static_cast<uint64_t>(i)) continue;
    if (s->limit != 0 && s->rposted >= s->limit) continue;
    void* data[1] = {s->in[i].data()};
    size_t sizes[1] = {s->size};
    int tags[1] = {1};
    void* mhs[1] = {s->mhIn[i]};
    void* req = nullptr;
    ncclResult_t rc = ctx.net->irecv(s->recv, 1, data, sizes, tags, mhs, &req);
    if (isError(rc)) return failDir(false, rc, "irecv");
    if (req == nullptr) continue;
    s->rreq[i] = req;
    s->rseqOf[i] = s->rposted++;
  }
}

void closeStream(Context& ctx, Stream* s) {
  for (int i = 0; i < kStreamWindow; ++i) {
    if (s->send != nullptr) deregHost(ctx, s->send, s->mhOut[i], format("send buffer %d to rank %d", i, s->peer));
    if (s->recv != nullptr) deregHost(ctx, s->recv, s->mhIn[i], format("recv buffer %d from rank %d", i, s->peer));
  }
}


}  // namespace e2e
