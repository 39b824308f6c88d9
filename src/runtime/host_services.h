// Services the framework lends to plugins (pc_host_services_t is built from these in
// src/runtime): a key-value store for bootstrapping communicators and a counter sink the
// framework reads for /metrics. Plugin log lines go to spdlog (stderr) tagged with the plugin.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "util/status.h"

namespace polychip::runtime {

class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists or timeout_ms elapses (UNAVAILABLE). timeout_ms < 0: forever.
  virtual StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) = 0;
};

// One process: a map with a condition variable.
class InProcessKvStore : public KvStore {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// Several processes on one host: one file per key in `dir` (written to a temporary name and
// renamed, so a reader never sees a partial value); Get polls.
class FileKvStore : public KvStore {
 public:
  explicit FileKvStore(std::string dir);
  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) override;
  const std::string& dir() const { return dir_; }

 private:
  std::string PathFor(const std::string& key) const;
  std::string dir_;
};

// Named counters added to by plugins (and the framework); read for /metrics.
class CounterSink {
 public:
  static CounterSink& Global();
  void Add(const std::string& name, double delta);
  double Get(const std::string& name) const;  // 0 if never added
  std::vector<std::pair<std::string, double>> Snapshot() const;  // sorted by name

 private:
  mutable std::mutex mu_;
  std::map<std::string, double> values_;
};

// The store handed to plugins loaded from now on (default: a process-wide InProcessKvStore).
// Set it before loading a comm plugin for multi-process bootstrap.
void SetHostKvStore(std::shared_ptr<KvStore> store);
std::shared_ptr<KvStore> HostKvStore();

}  // namespace polychip::runtime
