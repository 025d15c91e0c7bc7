// SPDX-License-Identifier: Apache-2.0
// transport_bench: the measurement that chose the fabric's transport between processes.
//
// Two processes (fork) move messages from a buffer in one into a buffer in the other, the
// way the fabric's NIC must execute an RDMA WRITE, over three candidate transports:
//   unix   a Unix stream socket: the requester writev()s header + payload straight from
//          its buffer, the responder reads the header, then recv()s the payload straight
//          into the destination (two copies, both in the kernel);
//   shm    a shared-memory ring (memfd, 8 MiB) with futex wake-ups: memcpy in, memcpy out;
//   pvm    a Unix socket carries only the header; the responder pulls the payload with
//          process_vm_readv (one copy; needs ptrace rights over the requester).
// Every wait blocks (futex or socket); nothing spins, as the fabric's NIC thread must not.
// Prints MB/s for 64 KiB and 1 MiB messages (a window of messages, one ACK at the end)
// and the 8-byte round trip (ping-pong), best of --rounds.
//
//   transport_bench [--rounds 3] [--mib 512]
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char* what) {
  perror(what);
  _exit(2);
}

void readAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) die("read");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void writeAll(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r <= 0) die("write");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

struct Header {
  uint64_t addr;  // requester's source address (pvm) or 0
  uint64_t len;
};

// --- shared-memory ring -------------------------------------------------------------------
constexpr size_t kRing = 8u << 20;
struct Ring {
  alignas(64) std::atomic<uint32_t> headSeq;  // futex word: bumped when data is added
  alignas(64) std::atomic<uint32_t> tailSeq;  // futex word: bumped when space is freed
  alignas(64) std::atomic<uint64_t> head;     // bytes written
  alignas(64) std::atomic<uint64_t> tail;     // bytes consumed
  alignas(64) std::atomic<uint32_t> waiters;
  alignas(64) char data[kRing];
};

void futexWait(std::atomic<uint32_t>* w, uint32_t v) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, v, nullptr, nullptr, 0);
}
void futexWake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

void ringPut(Ring* r, const char* src, size_t n) {
  while (n > 0) {
    uint64_t head = r->head.load(std::memory_order_relaxed);
    uint32_t seq = r->tailSeq.load(std::memory_order_acquire);
    uint64_t space = kRing - (head - r->tail.load(std::memory_order_acquire));
    if (space == 0) {
      futexWait(&r->tailSeq, seq);
      continue;
    }
    size_t off = head % kRing;
    size_t k = std::min<size_t>({n, space, kRing - off});
    memcpy(r->data + off, src, k);
    r->head.store(head + k, std::memory_order_release);
    r->headSeq.fetch_add(1, std::memory_order_release);
    futexWake(&r->headSeq);
    src += k;
    n -= k;
  }
}

void ringGet(Ring* r, char* dst, size_t n) {
  while (n > 0) {
    uint64_t tail = r->tail.load(std::memory_order_relaxed);
    uint32_t seq = r->headSeq.load(std::memory_order_acquire);
    uint64_t avail = r->head.load(std::memory_order_acquire) - tail;
    if (avail == 0) {
      futexWait(&r->headSeq, seq);
      continue;
    }
    size_t off = tail % kRing;
    size_t k = std::min<size_t>({n, avail, kRing - off});
    memcpy(dst, r->data + off, k);
    r->tail.store(tail + k, std::memory_order_release);
    r->tailSeq.fetch_add(1, std::memory_order_release);
    futexWake(&r->tailSeq);
    dst += k;
    n -= k;
  }
}

// --- one experiment -------------------------------------------------------------------------
enum class Kind { Unix, Shm, Pvm };
const char* name(Kind k) { return k == Kind::Unix ? "unix" : k == Kind::Shm ? "shm" : "pvm"; }

struct Pair {
  int sock[2];
  Ring* ring[2];  // [0]: parent -> child, [1]: child -> parent
};

// The requester side: `count` messages of `size` bytes (bandwidth), then waits for 1 ACK.
void sendMessages(Kind k, Pair& p, int me, const char* buf, size_t size, int count) {
  int fd = p.sock[me];
  for (int i = 0; i < count; ++i) {
    Header h{reinterpret_cast<uint64_t>(buf), size};
    if (k == Kind::Unix) {
      iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(buf), size}};
      size_t total = sizeof(h) + size;
      int idx = 0;
      while (total > 0) {
        ssize_t r = writev(fd, iov + idx, 2 - idx);
        if (r <= 0) die("writev");
        total -= static_cast<size_t>(r);
        size_t rr = static_cast<size_t>(r);
        while (idx < 2 && rr >= iov[idx].iov_len) rr -= iov[idx++].iov_len;
        if (idx < 2) {
          iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + rr;
          iov[idx].iov_len -= rr;
        }
      }
    } else if (k == Kind::Shm) {
      ringPut(p.ring[me], reinterpret_cast<const char*>(&h), sizeof(h));
      ringPut(p.ring[me], buf, size);
    } else {
      writeAll(fd, &h, sizeof(h));
      char ack;
      readAll(fd, &ack, 1);  // the responder has pulled it: the buffer may be reused
    }
  }
}

void recvMessages(Kind k, Pair& p, int me, pid_t peer, char* dst, int count) {
  int fd = p.sock[me];
  for (int i = 0; i < count; ++i) {
    Header h;
    if (k == Kind::Shm) {
      ringGet(p.ring[1 - me], reinterpret_cast<char*>(&h), sizeof(h));
      ringGet(p.ring[1 - me], dst, h.len);
      continue;
    }
    readAll(fd, &h, sizeof(h));
    if (k == Kind::Unix) {
      readAll(fd, dst, h.len);
    } else {
      iovec local{dst, h.len}, remote{reinterpret_cast<void*>(h.addr), h.len};
      size_t done = 0;
      while (done < h.len) {
        ssize_t r = process_vm_readv(peer, &local, 1, &remote, 1, 0);
        if (r <= 0) die("process_vm_readv");
        done += static_cast<size_t>(r);
        local.iov_base = static_cast<char*>(local.iov_base) + r;
        local.iov_len -= static_cast<size_t>(r);
        remote.iov_base = static_cast<char*>(remote.iov_base) + r;
        remote.iov_len -= static_cast<size_t>(r);
      }
      writeAll(fd, "a", 1);
    }
  }
}

// Parent = rank 0 (requester for bandwidth), child = rank 1.
struct Result {
  double mbps64k = 0, mbps1m = 0, rttUs = 0;
};

Result run(Kind k, int rounds, size_t totalMiB) {
  Pair p;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, p.sock) != 0) die("socketpair");
  for (Ring*& r : p.ring) {
    void* m = mmap(nullptr, sizeof(Ring), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap");
    r = new (m) Ring();
  }
  const size_t big = 1u << 20;
  std::vector<char> src(big, 'x'), dst(big);
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) die("fork");
  int me = child == 0 ? 1 : 0;
  pid_t peer = child == 0 ? parent : child;
  Result best;
  for (int round = 0; round < rounds; ++round) {
    for (size_t size : {size_t{64} << 10, big}) {
      int count = static_cast<int>((totalMiB << 20) / size);
      auto t0 = Clock::now();
      if (me == 0) {
        sendMessages(k, p, 0, src.data(), size, count);
        char ack;
        readAll(p.sock[0], &ack, 1);
      } else {
        recvMessages(k, p, 1, peer, dst.data(), count);
        writeAll(p.sock[1], "A", 1);
      }
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      double mbps = static_cast<double>(count) * static_cast<double>(size) / s / 1e6;
      double& slot = size == big ? best.mbps1m : best.mbps64k;
      slot = std::max(slot, mbps);
    }
    // 8-byte ping-pong: rank 0 sends, rank 1 answers with its own message.
    const int iters = 20000;
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      if (me == 0) {
        sendMessages(k, p, 0, src.data(), 8, 1);
        recvMessages(k, p, 0, peer, dst.data(), 1);
      } else {
        recvMessages(k, p, 1, peer, dst.data(), 1);
        sendMessages(k, p, 1, src.data(), 8, 1);
      }
    }
    double us = std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 / iters;
    if (best.rttUs == 0 || us < best.rttUs) best.rttUs = us;
  }
  if (me == 1) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "transport_bench: %s: the child failed\n", name(k));
    exit(1);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  size_t mib = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--mib")) mib = static_cast<size_t>(atol(argv[i + 1]));
  }
  printf("transport  64KiB_MBps  1MiB_MBps  8B_round_trip_us   (best of %d, %zu MiB per size)\n",
         rounds, mib);
  for (Kind k : {Kind::Unix, Kind::Shm, Kind::Pvm}) {
    Result r = run(k, rounds, mib);
    printf("%-9s  %10.0f  %9.0f  %17.1f\n", name(k), r.mbps64k, r.mbps1m, r.rttUs);
    fflush(stdout);
  }
  return 0;
}
