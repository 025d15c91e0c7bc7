// SPDX-License-Identifier: Apache-2.0
// The live counters' publication and reading (mesh/stats/stats.h): the file, its slots, the
// reader's checks, stale files, sums and deltas.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "mesh/stats/stats.h"
#include "temp_dir.h"

namespace mesh {
namespace stats {
namespace {

class StatsDir : public ::testing::Test {
 protected:
  void TearDown() override { Publisher::close(); }
  std::string open() {
    std::string path, why;
    EXPECT_TRUE(Publisher::open(dir_, &path, &why)) << why;
    return path;
  }
  TempDir tmp_{"mesh-stats-test."};
  std::string root_ = tmp_.path();
  std::string dir_ = root_ + "/stats";
};

std::string slurp(const std::string& path) {
  std::string out;
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  fclose(f);
  return out;
}

void spit(const std::string& path, const std::string& bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  fclose(f);
}

TEST_F(StatsDir, PublishesWhatCommsCountInAPrivateFileRemovedAtClose) {
  std::string path = open();
  struct stat st {};
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(Publisher::active());

  LinkSlot* a = Publisher::link("rocep1s0f1", 1, 0xc6120001, 0xc6120002);
  LinkSlot* b = Publisher::link("roceP2p1s0f1", 1, 0xc6120081, 0xc6120082);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(Publisher::link("rocep1s0f1", 1, 0xc6120001, 0xc6120002), a) << "one slot per key";
  add(&a->txBytes, 1000);
  add(&a->txOps, 2);
  add(&b->rxBytes, 77);
  FlowSlot* direct = Publisher::flow(FlowKind::Direct, 0xc6120002, 0, 0);
  FlowSlot* relayed = Publisher::flow(FlowKind::Relayed, 0xc6120203, 0xc6120002, 0);
  EXPECT_NE(direct, relayed);
  add(&relayed->txBytes, 4096);
  add(&relayed->opened, 1);
  Publisher::event(kConnects);
  Publisher::event(kConnects);

  ProcessCounts p;
  std::string why;
  ASSERT_TRUE(readFile(path, &p, &why)) << why;
  EXPECT_EQ(p.pid, getpid());
  EXPECT_EQ(p.startTicks, processStartTicks(getpid()));
  EXPECT_EQ(p.events[kConnects], 2u);
  ASSERT_EQ(p.links.size(), 2u);
  EXPECT_EQ(p.links[0].device, "rocep1s0f1");
  EXPECT_EQ(p.links[0].txBytes, 1000u);
  EXPECT_EQ(p.links[0].txOps, 2u);
  EXPECT_EQ(p.links[1].rxBytes, 77u);
  ASSERT_EQ(p.flows.size(), 2u);
  EXPECT_EQ(p.flows[1].kind, FlowKind::Relayed);
  EXPECT_EQ(p.flows[1].viaAddr, 0xc6120002u);
  EXPECT_EQ(p.flows[1].txBytes, 4096u);

  Publisher::close();
  EXPECT_FALSE(Publisher::active());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the file goes with the plugin";
  EXPECT_EQ(Publisher::link("rocep1s0f1", 1, 1, 2), nullptr) << "closed: the comms count into their sinks";
}

// Containers sharing /dev/shm (--ipc=host) have the host's hostname and often the same pids:
// the name carries the PID namespace, and a close removes the path only while it is still
// the file this process created (another's, renamed over it, was deleted while live).
TEST_F(StatsDir, TheFileNameCarriesThePidNamespaceAndACloseRemovesOnlyItsOwnFile) {
  std::string path = open();
  ASSERT_NE(pidNamespace(), 0u);
  std::string tail = "." + std::to_string(pidNamespace()) + ".stats";
  EXPECT_NE(path.find("." + std::to_string(getpid()) + "."), std::string::npos) << path;
  ASSERT_GT(path.size(), tail.size());
  EXPECT_EQ(path.substr(path.size() - tail.size()), tail) << path;
  // Another process's file now at that path (what the rename of a same-named one did).
  std::string other = dir_ + "/.other";
  spit(other, "another process's counters");
  ASSERT_EQ(rename(other.c_str(), path.c_str()), 0);
  Publisher::close();
  EXPECT_EQ(slurp(path), "another process's counters") << "the close removed a file that was not its own";
}

TEST_F(StatsDir, OffOrUnusableDirectoryMeansTheSinks) {
  EXPECT_EQ(Publisher::link("d", 1, 1, 2), nullptr);
  EXPECT_EQ(Publisher::flow(FlowKind::Direct, 2, 0, 0), nullptr);
  ASSERT_EQ(mkdir(dir_.c_str(), 0777), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
  std::string path, why;
  EXPECT_FALSE(Publisher::open(dir_, &path, &why));
  EXPECT_NE(why.find("writable by others"), std::string::npos) << why;
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(dir_.c_str(), 1, 1), 0);
    EXPECT_FALSE(Publisher::open(dir_, &path, &why));
    EXPECT_NE(why.find("belongs to uid 1"), std::string::npos) << why;
  }
  std::string file = root_ + "/plain";
  spit(file, "x");
  EXPECT_FALSE(prepareDir(file, &why));
  EXPECT_NE(why.find("not a directory"), std::string::npos) << why;
}

TEST_F(StatsDir, FullSlotsAreRefusedAndSaySo) {
  std::string path = open();
  for (int i = 0; i < kMaxLinkSlots; ++i) EXPECT_NE(Publisher::link("d", 1, 1, static_cast<uint32_t>(i + 10)), nullptr);
  EXPECT_EQ(Publisher::link("d", 1, 1, 5), nullptr);
  ProcessCounts p;
  std::string why;
  ASSERT_TRUE(readFile(path, &p, &why)) << why;
  EXPECT_EQ(p.links.size(), static_cast<size_t>(kMaxLinkSlots));
  EXPECT_EQ(p.events[kSlotsFull], 1u);
}

// A counter is one aligned word added to atomically: a reader never sees a value that was
// never there (a torn one), and every value it sees is at least the one before.
TEST_F(StatsDir, ConcurrentReadsSeeOnlyWholeGrowingValues) {
  std::string path = open();
  LinkSlot* l = Publisher::link("d", 1, 1, 2);
  constexpr uint64_t kStep = 0x100000001ull;  // both 32-bit halves move: a torn read shows
  constexpr int kAdds = 200000;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < kAdds; ++i) add(&l->txBytes, kStep);
    done.store(true);
  });
  uint64_t last = 0;
  int reads = 0;
  while (!done.load() || reads < 3) {
    ProcessCounts p;
    std::string why;
    ASSERT_TRUE(readFile(path, &p, &why)) << why;
    ASSERT_EQ(p.links.size(), 1u);
    uint64_t v = p.links[0].txBytes;
    ASSERT_EQ(v % kStep, 0u) << "torn value " << v;
    ASSERT_GE(v, last);
    last = v;
    ++reads;
  }
  writer.join();
  // One more read after the writer is done: the whole count, never less than seen before.
  ProcessCounts p;
  std::string why;
  ASSERT_TRUE(readFile(path, &p, &why)) << why;
  EXPECT_GE(p.links[0].txBytes, last);
  EXPECT_EQ(p.links[0].txBytes, kStep * kAdds);
}

TEST_F(StatsDir, ForeignShortAndOtherVersionFilesAreNamedNotRead) {
  std::string path = open();
  std::string good = slurp(path);
  ASSERT_EQ(good.size(), sizeof(StatsFile));
  spit(dir_ + "/short.stats", good.substr(0, 100));
  spit(dir_ + "/junk.stats", std::string(sizeof(StatsFile), 'x'));
  std::string v2 = good;
  uint32_t nine = 9;
  memcpy(&v2[offsetof(StatsHeader, version)], &nine, sizeof(nine));
  spit(dir_ + "/v9.stats", v2);
  spit(dir_ + "/notes.txt", "not ours");
  ReadResult r = readDir(dir_, true);
  ASSERT_EQ(r.processes.size(), 1u);
  EXPECT_EQ(r.processes[0].pid, getpid());
  ASSERT_EQ(r.warnings.size(), 3u);
  std::string all;
  for (const std::string& w : r.warnings) all += w + "\n";
  EXPECT_NE(all.find("short.stats: too short"), std::string::npos) << all;
  EXPECT_NE(all.find("junk.stats: not an nccl-mesh stats file"), std::string::npos) << all;
  EXPECT_NE(all.find("v9.stats: layout version 9"), std::string::npos) << all;
  EXPECT_TRUE(readDir(root_ + "/nonexistent", true).warnings.empty()) << "no directory: no job, no warning";
}

// Anyone may put a FIFO named *.stats in a shared stats directory: opening it for reading
// blocked until a writer came, and root's --prometheus exporter hung at its first sample.
TEST_F(StatsDir, AFifoNamedLikeAStatsFileIsNamedNotWaitedOn) {
  std::string path = open();
  ASSERT_EQ(mkfifo((dir_ + "/pipe.stats").c_str(), 0600), 0) << strerror(errno);
  ReadResult r = readDir(dir_, true);  // returns: a hang here fails by the test's timeout
  ASSERT_EQ(r.processes.size(), 1u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("pipe.stats: not a regular file"), std::string::npos) << r.warnings[0];
}

// A process killed by a signal leaves its file: the reader removes it (ours) and goes on.
TEST_F(StatsDir, AKilledProcessFileIsRemovedAndTheRestStillRead) {
  std::string path = open();
  std::string bytes = slurp(path);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // its pid is free now: a dead process
  int64_t dead = child;
  memcpy(&bytes[offsetof(StatsHeader, pid)], &dead, sizeof(dead));
  std::string stale = dir_ + "/host." + std::to_string(child) + ".1.stats";
  spit(stale, bytes);
  ReadResult keep = readDir(dir_, false);
  EXPECT_EQ(keep.processes.size(), 1u);
  EXPECT_EQ(keep.staleSkipped, 1);
  EXPECT_EQ(access(stale.c_str(), F_OK), 0) << "not removed when told not to";
  ReadResult r = readDir(dir_, true);
  ASSERT_EQ(r.processes.size(), 1u);
  EXPECT_EQ(r.processes[0].pid, getpid());
  ASSERT_EQ(r.removed.size(), 1u);
  EXPECT_NE(r.removed[0].find("pid " + std::to_string(child) + " is gone"), std::string::npos) << r.removed[0];
  EXPECT_NE(access(stale.c_str(), F_OK), 0);
  // Written in another PID namespace (a container sharing /dev/shm): its pid means nothing
  // here, so it is never judged stale, whatever that pid is here.
  uint64_t otherNs = pidNamespace() + 1;
  memcpy(&bytes[offsetof(StatsHeader, pidNs)], &otherNs, sizeof(otherNs));
  std::string foreign = dir_ + "/container." + std::to_string(child) + ".1.stats";
  spit(foreign, bytes);
  ReadResult f = readDir(dir_, true);
  EXPECT_EQ(f.processes.size(), 2u);
  EXPECT_TRUE(f.removed.empty());
  EXPECT_EQ(access(foreign.c_str(), F_OK), 0) << "another namespace's file is kept";
  EXPECT_NE(pidNamespace(), 0u);
  // A live pid that started at another time is a reused pid: stale too.
  EXPECT_TRUE(processAlive(getpid(), processStartTicks(getpid())));
  EXPECT_FALSE(processAlive(getpid(), processStartTicks(getpid()) + 1));
  EXPECT_FALSE(processAlive(child, 0));
}

ProcessCounts proc(const std::string& file, int64_t pid, uint64_t tx, uint64_t flowRx) {
  ProcessCounts p;
  p.file = file;
  p.pid = pid;
  LinkCount l;
  l.device = "d";
  l.port = 1;
  l.localAddr = 1;
  l.peerAddr = 2;
  l.txBytes = tx;
  p.links.push_back(l);
  FlowCount f;
  f.peerAddr = 2;
  f.rxBytes = flowRx;
  f.opened = 1;
  p.flows.push_back(f);
  p.events[kConnects] = 1;
  return p;
}

TEST(StatsSums, MergeAddsEveryProcessByKey) {
  Totals t = merge({proc("a", 1, 100, 10), proc("b", 2, 50, 5)});
  EXPECT_EQ(t.processes, 2);
  ASSERT_EQ(t.links.size(), 1u);
  EXPECT_EQ(t.links[0].txBytes, 150u);
  ASSERT_EQ(t.flows.size(), 1u);
  EXPECT_EQ(t.flows[0].rxBytes, 15u);
  EXPECT_EQ(t.flows[0].opened, 2u);
  EXPECT_EQ(t.events[kConnects], 2u);
}

TEST(StatsSums, DeltasNeverGoBackWhenProcessesComeAndGo) {
  // a goes on, b ends, c starts (its file began at zero: all it counted is new).
  std::vector<ProcessCounts> before{proc("a", 1, 100, 10), proc("b", 2, 500, 50)};
  std::vector<ProcessCounts> after{proc("a", 1, 160, 30), proc("c", 3, 7, 1)};
  Totals d = deltas(before, after);
  ASSERT_EQ(d.links.size(), 1u);
  EXPECT_EQ(d.links[0].txBytes, 60u + 7u);
  EXPECT_EQ(d.flows[0].rxBytes, 20u + 1u);
  EXPECT_EQ(d.events[kConnects], 1u) << "c's connect is new, a's is not";
  // A pid reused under the same file name is another process: counted whole, not negative.
  std::vector<ProcessCounts> again{proc("a", 9, 3, 0)};
  Totals r = deltas(before, again);
  EXPECT_EQ(r.links[0].txBytes, 3u);
  // A counter that went back (it cannot, but a file replaced in between could) is 0.
  Totals z = deltas({proc("a", 1, 100, 10)}, {proc("a", 1, 90, 10)});
  EXPECT_EQ(z.links[0].txBytes, 0u);
}

TEST(StatsSums, AnEndedProcessKeepsItsCountsForAPrometheusReader) {
  std::vector<ProcessCounts> departed;
  std::vector<ProcessCounts> s1{proc("a", 1, 100, 10), proc("b", 2, 500, 50)};
  std::vector<ProcessCounts> s2{proc("a", 1, 160, 30)};  // b ended
  foldDeparted(s1, s2, &departed);
  ASSERT_EQ(departed.size(), 1u);
  EXPECT_EQ(departed[0].file, kDepartedFile);
  EXPECT_EQ(departed[0].flows[0].closed, departed[0].flows[0].opened) << "its comms are closed";
  std::vector<ProcessCounts> all = s2;
  all.insert(all.end(), departed.begin(), departed.end());
  Totals t = merge(all);
  EXPECT_EQ(t.links[0].txBytes, 660u) << "160 from a, 500 that b counted: never less than before (600)";
  foldDeparted(s2, s2, &departed);
  EXPECT_EQ(departed.size(), 1u) << "nobody else ended";
}

TEST(StatsSums, EndedProcessesFoldIntoOneRecordWhateverTheirNumber) {
  // A reader beside a thousand short jobs: one record, the sum, not a thousand.
  std::vector<ProcessCounts> departed;
  uint64_t tx = 0, rx = 0;
  for (int i = 0; i < 1000; ++i) {
    std::vector<ProcessCounts> s1{proc("a", 1, 100, 10), proc("job" + std::to_string(i), 100 + i, 5 + i, 2)};
    std::vector<ProcessCounts> s2{proc("a", 1, 100, 10)};
    foldDeparted(s1, s2, &departed);
    tx += 5 + static_cast<uint64_t>(i);
    rx += 2;
  }
  ASSERT_EQ(departed.size(), 1u);
  ASSERT_EQ(departed[0].links.size(), 1u) << "the same cable end: one row";
  ASSERT_EQ(departed[0].flows.size(), 1u);
  EXPECT_EQ(departed[0].links[0].txBytes, tx);
  EXPECT_EQ(departed[0].flows[0].rxBytes, rx);
  EXPECT_EQ(departed[0].flows[0].closed, departed[0].flows[0].opened);
  EXPECT_EQ(departed[0].events[kConnects], 1000u);
  std::vector<ProcessCounts> all{proc("a", 1, 100, 10)};
  all.push_back(departed[0]);
  Totals t = merge(all);
  EXPECT_EQ(t.links[0].txBytes, 100u + tx) << "merge sees the running process and every ended one";
}

}  // namespace
}  // namespace stats
}  // namespace mesh
