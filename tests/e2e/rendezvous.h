// SPDX-License-Identifier: Apache-2.0
// Out-of-band exchange between the ranks through files in a directory every rank can
// write ($VMESH_SHARED in the lab: a 9p mount with cache=none, shared by all guests).
// A file appears whole or not at all: written under a temporary name, then rename()d.
// Readers poll with a deadline. A rank that fails writes abort.<rank>; every wait checks
// for those, so the other ranks stop at once with the first rank's reason instead of
// waiting out their deadline.
// Owns: the scenario's directory <shared>/e2e.<scenario>.<run-id>/.
#pragma once

#include <string>

#include "e2e_util.h"

namespace e2e {

class Rendezvous {
 public:
  Rendezvous(const std::string& sharedDir, const std::string& scenario,
             const std::string& runId, int rank, int nodes);

  const std::string& dir() const { return dir_; }

  void publish(const std::string& name, const std::string& bytes);
  // Non-blocking: true and the contents if the file exists. Checks aborts now and then.
  bool tryFetch(const std::string& name, std::string* bytes);
  // Polls until the file exists. Throws Failure naming `why` at the deadline.
  std::string fetch(const std::string& name, const Deadline& deadline, const std::string& why);
  bool exists(const std::string& name) const;
  // Every rank publishes bar.<name>.<rank> and waits for all of them.
  void barrier(const std::string& name, const Deadline& deadline);

  // Tells the other ranks this one failed (best effort; never throws).
  void abort(const std::string& reason) noexcept;
  // Throws Failure if another rank wrote abort.<r>.
  void checkAborts();

 private:
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
  int rank_;
  int nodes_;
  unsigned polls_ = 0;
};

}  // namespace e2e
