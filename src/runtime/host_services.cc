#include "runtime/host_services.h"

#include "runtime/log.h"
#include <sys/stat.h>

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/abi_internal.h"

namespace polychip::runtime {

// ---- in-process store --------------------------------------------------------------------

Status InProcessKvStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  cv_.notify_all();
  return Status::Ok();
}

StatusOr<std::string> InProcessKvStore::Get(const std::string& key, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return values_.count(key) != 0; };
  if (timeout_ms < 0) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return Unavailable("key '" + key + "' not set within " + std::to_string(timeout_ms) + " ms");
  }
  return values_[key];
}

// ---- file-directory store ----------------------------------------------------------------

FileKvStore::FileKvStore(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
}

std::string FileKvStore::PathFor(const std::string& key) const {
  // Keys may hold '/' or other characters unfit for a file name: hex-encode anything odd.
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      name += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02x", c);
      name += buf;
    }
  }
  return dir_ + "/" + name;
}

Status FileKvStore::Set(const std::string& key, const std::string& value) {
  const std::string path = PathFor(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Unavailable("kv store: cannot write " + tmp);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) return Unavailable("kv store: short write to " + tmp);
  }
  // rename() is atomic: a concurrent reader sees the whole value or nothing.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Unavailable("kv store: cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

StatusOr<std::string> FileKvStore::Get(const std::string& key, int64_t timeout_ms) {
  const std::string path = PathFor(key);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
      return Unavailable("key '" + key + "' not set within " + std::to_string(timeout_ms) +
                         " ms (in " + dir_ + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// ---- counters ----------------------------------------------------------------------------

CounterSink& CounterSink::Global() {
  static CounterSink* sink = new CounterSink();  // never destroyed: plugins may log late
  return *sink;
}

void CounterSink::Add(const std::string& name, double delta) {
  std::lock_guard<std::mutex> lock(mu_);
  values_[name] += delta;
}

double CounterSink::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(name);
  return it == values_.end() ? 0.0 : it->second;
}

std::vector<std::pair<std::string, double>> CounterSink::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {values_.begin(), values_.end()};
}

// ---- the C services ----------------------------------------------------------------------

namespace {

std::mutex& KvMutex() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<KvStore>& KvSlot() {
  static std::shared_ptr<KvStore>* slot =
      new std::shared_ptr<KvStore>(std::make_shared<InProcessKvStore>());
  return *slot;
}

// Every service is a noexcept trampoline: nothing may unwind into plugin code.
void HostLog(void*, pc_log_level_t level, const char* source, const char* message) noexcept {
  try {
    const char* src = source != nullptr ? source : "plugin";
    const char* msg = message != nullptr ? message : "";
    switch (level) {
      case PC_LOG_DEBUG: Log().debug("[{}] {}", src, msg); break;
      case PC_LOG_INFO: Log().info("[{}] {}", src, msg); break;
      case PC_LOG_WARNING: Log().warn("[{}] {}", src, msg); break;
      default: Log().error("[{}] {}", src, msg); break;
    }
  } catch (...) {
  }
}

pc_code_t HostKvSet(void*, const char* key, const void* value, size_t size) noexcept {
  try {
    if (key == nullptr || (value == nullptr && size != 0)) return PC_CODE_INVALID_ARGUMENT;
    std::string v(static_cast<const char*>(value), size);
    return ToPcCode(HostKvStore()->Set(key, v).code());
  } catch (...) {
    return PC_CODE_INTERNAL;
  }
}

pc_code_t HostKvGet(void*, const char* key, void* value, size_t capacity, size_t* value_size,
                    int64_t timeout_ms) noexcept {
  try {
    if (key == nullptr) return PC_CODE_INVALID_ARGUMENT;
    StatusOr<std::string> v = HostKvStore()->Get(key, timeout_ms);
    if (!v.ok()) return ToPcCode(v.status().code());
    if (value_size != nullptr) *value_size = v->size();
    if (v->size() > capacity || (value == nullptr && !v->empty())) {
      return PC_CODE_RESOURCE_EXHAUSTED;
    }
    if (!v->empty()) std::memcpy(value, v->data(), v->size());
    return PC_CODE_OK;
  } catch (...) {
    return PC_CODE_INTERNAL;
  }
}

void HostCounterAdd(void*, const char* name, double delta) noexcept {
  try {
    if (name != nullptr) CounterSink::Global().Add(name, delta);
  } catch (...) {
  }
}

}  // namespace

void SetHostKvStore(std::shared_ptr<KvStore> store) {
  std::lock_guard<std::mutex> lock(KvMutex());
  KvSlot() = store ? std::move(store) : std::make_shared<InProcessKvStore>();
}

std::shared_ptr<KvStore> HostKvStore() {
  std::lock_guard<std::mutex> lock(KvMutex());
  return KvSlot();
}

const pc_host_services_t* HostServices() {
  static const pc_host_services_t services = {
      sizeof(pc_host_services_t), nullptr, &HostLog, &HostKvSet, &HostKvGet, &HostCounterAdd,
  };
  return &services;
}

}  // namespace polychip::runtime
