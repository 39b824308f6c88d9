// The loaded comm (collective communication) plugin, as a C++ object. A Communicator wrapper
// over its collectives belongs here too (added with the dist module), so that no module
// outside src/runtime includes the ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/config.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::runtime {

struct CommImpl;  // runtime-internal (abi_internal.h)
class Stream;

class CommPlugin : public std::enable_shared_from_this<CommPlugin> {
 public:
  ~CommPlugin();  // shutdown, then unload
  CommPlugin(const CommPlugin&) = delete;
  CommPlugin& operator=(const CommPlugin&) = delete;

  const std::string& name() const;
  const std::string& path() const;
  const std::string& version() const;
  uint32_t abi_major() const;
  uint32_t abi_minor() const;
  // True if collectives take device addresses of backend `device_plugin()`; else host memory.
  bool reads_device_memory() const;
  std::string device_plugin() const;

  CommImpl& impl() const { return *impl_; }
  explicit CommPlugin(std::unique_ptr<CommImpl> impl);  // runtime-internal

 private:
  std::unique_ptr<CommImpl> impl_;
};

}  // namespace polychip::runtime
