// SPDX-License-Identifier: Apache-2.0
// What the scenarios measure outside the plugin: open file descriptors, the RDMA resource
// counts and the port counters. Two backends: the kernel's (`rdma res show`, rxe's sysfs
// hw_counters; the QEMU lab) and the userspace fabric's (tests/fabric: its stats files,
// when MESHFAB_DIR is set). Nothing here talks to the plugin.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace e2e {

// Entries in /proc/self/fd (not counting the directory handle used to count them, nor the
// fabric transport's own fds, which come and go with peer processes).
int countOpenFds();
// Threads of this process (/proc/self/task).
int countThreads();
// True while a mapping of a file whose path contains `name` is in /proc/self/maps.
bool libraryMapped(const std::string& name);

struct RdmaResources {
  bool ok = false;
  std::string error;                        // why not ok
  std::map<std::string, long> total;        // summed over devices: pd, cq, qp, mr, ...
  std::map<std::string, std::string> perDevice;  // device -> "pd 1 cq 2 ..."
};
// Runs `rdma res show` (posix_spawn: no copy of the caller's registered memory) and sums
// the counts of every device.
RdmaResources rdmaResources();
// "qp 2 cq 4 mr 3 pd 1" for the keys the leak checks compare.
std::string describeResources(const RdmaResources& r);
// Empty when the counts of qp, cq, mr and pd are equal; else what differs.
std::string diffResources(const RdmaResources& before, const RdmaResources& after);
// The same, for the kinds whose count grew only ("" when none did, or either is unreadable).
std::string grownResources(const RdmaResources& before, const RdmaResources& after);

// /sys/class/infiniband/<dev>/ports/<port>/hw_counters/<name>, or -1.
// Runs argv, returns its stdout+stderr; false with *error when it cannot run or fails.
bool runCapture(const std::vector<std::string>& args, std::string* out, std::string* error);

long readPortCounter(const std::string& dev, int port, const std::string& name);
// "fab_p1=12.3M fab_p1f1=12.1M ..." : the bytes each of this node's fabric devices has sent
// (port 1, summed over the node's processes); "" off the fabric. For benchmark lines that
// must show how a cable's functions shared the traffic.
std::string fabricSentBytes();
// The fabric's counter `name` summed over every device of this node, or -1 off the fabric.
long fabricNodeCounter(const std::string& name);
// The largest of the fabric's counter `name` over this node's devices (for the counters that
// are maxima, such as max_passed_over), or -1 off the fabric.
long fabricNodeMax(const std::string& name);
// One line per RDMA device with its port 1 retransmission counters, e.g.
// "rxe_p1: duplicate_request=64 completer_retry_err=3 ..." (counters the provider lacks are
// left out). For failure reports: retransmissions on a lab that should have none are the
// first thing to rule out when a healthy link fails.
std::vector<std::string> retransmitCounters();
// RDMA devices whose name says they are cabled to `peer` in the lab: rxe_p<peer>,
// rxe_p<peer>b, ... (fab_p<peer>, ... on the fabric; sorted).
std::vector<std::string> labDevicesTowards(int peer);

// This process's TCP sockets (IPv4 and IPv6): /proc/self/fd's socket inodes looked up in
// /proc/self/net/tcp and tcp6 (the network namespace's table).
struct TcpSocket {
  int localPort = 0;
  int remotePort = 0;
  bool listening = false;
  bool established = false;
};
std::vector<TcpSocket> ownTcpSockets();

}  // namespace e2e
