// SPDX-License-Identifier: Apache-2.0
// How nccl-mesh-perf's two ranks meet: files in a shared directory (the lab) or one TCP
// connection over the management network (two hosts).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "mesh/tools/tool_net.h"
#include "perf.h"

namespace perf {

// The lab: files in a directory both ranks see.
class FileRendezvous : public Rendezvous {
 public:
  FileRendezvous(const Options& o, Clock::time_point deadline)
      : base_(o.rendezvous + "/nccl-mesh-perf." + o.tag + "."), rank_(o.rank), dir_(o.rendezvous), deadline_(deadline) {}
  std::string exchange(const std::string& step, const std::string& mine) override {
    std::string prefix = base_ + (step == "hello" ? "" : step + ".");
    publish(prefix + std::to_string(rank_), mine);
    return fetch(prefix + std::to_string(1 - rank_));
  }
  std::string describe() const override { return "files in " + dir_; }

 private:
  void publish(const std::string& path, const std::string& bytes) {
    std::string tmp = strf("%s.tmp%d", path.c_str(), static_cast<int>(getpid()));
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot create " + tmp + ": " + strerror(errno));
    bool ok = write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) throw Error("cannot write " + path + ": " + strerror(errno));
  }
  std::string fetch(const std::string& path) {
    for (;;) {
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        std::string out;
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
        close(fd);
        return out;
      }
      if (Clock::now() > deadline_) throw Error("timed out waiting for the peer's " + path);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  std::string base_;
  int rank_;
  std::string dir_;
  Clock::time_point deadline_;
};

// Two hosts: one TCP connection over the management network, open for the whole run.
class TcpRendezvous : public Rendezvous {
 public:
  TcpRendezvous(const Options& o, Clock::time_point deadline) : deadline_(deadline) {
    std::string error;
    if (o.mode == Mode::Client) {
      if (!mesh::ctrlConnect(o.host, o.port, deadline, &sock_, &error)) throw Error("--client: " + error);
      peer_ = o.host + ":" + std::to_string(o.port);
      return;
    }
    mesh::CtrlListener listener;
    if (!listener.listen(o.bind, o.port, &error)) throw Error("--server: " + error);
    fprintf(stderr, "nccl-mesh-perf: server listening on %s port %d; waiting for a client\n",
            o.bind.empty() ? "every interface" : o.bind.c_str(), listener.port());
    if (!listener.accept(&sock_, &peer_, deadline, &error)) throw Error("--server: " + error);
    fprintf(stderr, "nccl-mesh-perf: client %s connected\n", peer_.c_str());
  }
  std::string exchange(const std::string& step, const std::string& mine) override {
    std::string error, theirs;
    if (!sock_.send(step + "\n" + mine, deadline_, &error) || !sock_.recv(&theirs, deadline_, &error)) {
      throw Error("control connection to " + peer_ + " (step " + step + "): " + error);
    }
    if (theirs.compare(0, step.size() + 1, step + "\n") != 0) {
      throw Error("the peer at " + peer_ + " is out of step (expected '" + step +
                  "'); is it nccl-mesh-perf of the same version?");
    }
    return theirs.substr(step.size() + 1);
  }
  std::string describe() const override { return "TCP " + peer_; }

 private:
  mesh::CtrlSocket sock_;
  std::string peer_;
  Clock::time_point deadline_;
};

std::unique_ptr<Rendezvous> makeRendezvous(const Options& o, Clock::time_point deadline) {
  std::unique_ptr<Rendezvous> rv;
  if (o.mode == Mode::Files) rv.reset(new FileRendezvous(o, deadline));
  else rv.reset(new TcpRendezvous(o, deadline));
  return rv;
}

}  // namespace perf
