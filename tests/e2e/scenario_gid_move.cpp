// SPDX-License-Identifier: Apache-2.0
// gid-move (2 nodes, the QEMU lab: Soft-RoCE's GID table follows the kernel's addresses):
// the field's "GID index drift" while a job runs. Rank 1 removes its mesh address from its
// netdev, adds an IPv6 address (2001:2::/48, the IPv6 benchmarking range) whose GIDs take
// the freed slots, and adds the IPv4 address back: its RoCEv2 GID now sits at a higher index
// than the plugin read at init. A fresh pair of comms each way must connect and move data
// exact, rank 1's INFO saying the GID moved and its conn lines naming the new index (with the
// index read at init its QPs would send from the IPv6 GID). Then the address is removed again,
// the IPv6 one too, and re-added: back at its first index, as the boot group's later steps
// expect.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "comm_setup.h"
#include "scenarios.h"
#include "transfer.h"

namespace e2e {
namespace {

constexpr int kMover = 1;

// This rank's netdev and address on its link to `peer`, from the lab's link table
// (VMESH_LINK_TABLE: "index a b netdev_a netdev_b addr_a addr_b" per line).
void myLink(const Context& ctx, int peer, std::string* netdev, std::string* addr) {
  const char* table = getenv("VMESH_LINK_TABLE");
  if (table == nullptr) fail("gid-move: no VMESH_LINK_TABLE (run it in the lab: scripts/vmesh)");
  std::ifstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    int index, a, b;
    std::string na, nb, aa, ab;
    if (!(f >> index >> a >> b >> na >> nb >> aa >> ab)) continue;
    if (a == ctx.rank && b == peer) *netdev = na, *addr = aa;
    if (b == ctx.rank && a == peer) *netdev = nb, *addr = ab;
  }
  if (netdev->empty()) fail("gid-move: the link table %s has no link between rank %d and rank %d", table, ctx.rank, peer);
}

// sysfs spells an IPv4-mapped GID as 0000:0000:0000:0000:0000:ffff:c612:0002.
std::string mappedGidText(const std::string& addr) {
  unsigned o[4];
  if (sscanf(addr.c_str(), "%u.%u.%u.%u", &o[0], &o[1], &o[2], &o[3]) != 4) fail("gid-move: bad address %s", addr.c_str());
  return format("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", o[0], o[1], o[2], o[3]);
}

// The index of `addr`'s RoCEv2 GID on rxe_<netdev> port 1; -1 when there is none.
int rocev2Index(const std::string& netdev, const std::string& addr) {
  std::string port = "/sys/class/infiniband/rxe_" + netdev + "/ports/1";
  std::string want = mappedGidText(addr);
  // rxe has 1024 entries; removed ones leave holes, so look a little past the first empty one.
  for (int i = 0, empty = 0; i < 1024 && empty < 8; ++i) {
    std::string gid, type;
    std::getline(std::ifstream(format("%s/gids/%d", port.c_str(), i)), gid);
    if (gid.empty() || gid == "0000:0000:0000:0000:0000:0000:0000:0000") {
      ++empty;
      continue;
    }
    empty = 0;
    std::getline(std::ifstream(format("%s/gid_attrs/types/%d", port.c_str(), i)), type);
    if (gid == want && type == "RoCE v2") return i;
  }
  return -1;
}

void run(const std::string& cmd) {
  say("gid-move: %s", cmd.c_str());
  int rc = system(cmd.c_str());
  if (rc != 0) fail("gid-move: '%s' exited %d", cmd.c_str(), rc);
}

// Polls (at most 10 s) until the address's RoCEv2 GID is at an index `ok` accepts.
template <typename Ok>
int awaitIndex(const std::string& netdev, const std::string& addr, Ok ok, const char* what) {
  Deadline d(10, what);
  for (;;) {
    int index = rocev2Index(netdev, addr);
    if (ok(index)) return index;
    if (d.expired()) fail("gid-move: %s: the RoCEv2 GID of %s on rxe_%s is at index %d after 10 s", what, addr.c_str(),
                          netdev.c_str(), index);
    pollPause(20000);
  }
}

// A fresh comm each way with the peer and one exchange; the conn lines logged meanwhile.
std::vector<ConnLine> exchange(Context& ctx, int peer, const std::string& tag, uint64_t round) {
  size_t mark = ctx.net.logSize();
  CommTable t = establish(ctx, {{peer}, {peer}, 1, tag}, ctx.deadline);
  exchangeSmall(ctx, peer, t[peer].send[0], t[peer].recv[0], round, format("gid-move %s", tag.c_str()));
  closeAll(ctx, t);
  return ctx.net.connLines(mark);
}

}  // namespace

std::string runGidMove(Context& ctx) {
  requireNodes(ctx, 2);
  int peer = 1 - ctx.rank;
  std::string netdev, addr;
  myLink(ctx, peer, &netdev, &addr);
  std::string v6 = format("2001:2::%d/64", ctx.rank + 1);

  exchange(ctx, peer, "before", 1);
  int before = -1, moved = -1;
  if (ctx.rank == kMover) {
    before = rocev2Index(netdev, addr);
    if (before < 0) fail("gid-move: %s has no RoCEv2 GID on rxe_%s", addr.c_str(), netdev.c_str());
    run(format("ip address del %s/24 dev %s", addr.c_str(), netdev.c_str()));
    run(format("ip -6 address add %s dev %s nodad", v6.c_str(), netdev.c_str()));
    run(format("ip address add %s/24 dev %s", addr.c_str(), netdev.c_str()));
    moved = awaitIndex(netdev, addr, [&](int i) { return i >= 0 && i != before; }, "after the move");
    say("gid-move: the RoCEv2 GID of %s moved from index %d to %d", addr.c_str(), before, moved);
  }
  ctx.barrier("moved");

  size_t mark = ctx.net.logSize();
  std::vector<ConnLine> lines = exchange(ctx, peer, "after", 2);
  if (ctx.rank == kMover) {
    std::string said = format("moved from index %d to %d since init", before, moved);
    if (countLog(ctx, mark, said) == 0) fail("gid-move: no INFO line saying the GID '%s'", said.c_str());
    if (lines.empty()) fail("gid-move: the plugin logged no conn line for the comms after the move");
    for (const ConnLine& c : lines) {
      if (c.gidIndex != moved) fail("gid-move: a comm after the move uses GID index %d, not %d: %s", c.gidIndex, moved, c.raw.c_str());
    }
  }
  ctx.barrier("exchanged");

  int restored = -1;
  if (ctx.rank == kMover) {
    run(format("ip address del %s/24 dev %s", addr.c_str(), netdev.c_str()));
    run(format("ip -6 address del %s dev %s", v6.c_str(), netdev.c_str()));
    run(format("ip address add %s/24 dev %s", addr.c_str(), netdev.c_str()));
    restored = awaitIndex(netdev, addr, [&](int i) { return i == before; }, "after restoring");
  }
  ctx.barrier("restored");
  // And once more with the GID back where init found it.
  exchange(ctx, peer, "restored", 3);
  if (ctx.rank != kMover) return "role=peer";
  return format("role=mover gid_before=%d gid_moved=%d gid_restored=%d", before, moved, restored);
}

}  // namespace e2e
