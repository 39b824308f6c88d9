#include "runtime/comm.h"

#include "runtime/abi_internal.h"

namespace polychip::runtime {

CommPlugin::CommPlugin(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}

CommPlugin::~CommPlugin() {
  if (impl_->initialized) impl_->table->shutdown();
}

const std::string& CommPlugin::name() const { return impl_->name; }
const std::string& CommPlugin::path() const { return impl_->path; }
const std::string& CommPlugin::version() const { return impl_->version; }
uint32_t CommPlugin::abi_major() const { return impl_->table->abi_major; }
uint32_t CommPlugin::abi_minor() const { return impl_->table->abi_minor; }
bool CommPlugin::reads_device_memory() const {
  return impl_->table->memory_kind == PC_COMM_MEMORY_DEVICE;
}
std::string CommPlugin::device_plugin() const {
  const char* p = impl_->table->device_plugin;
  return reads_device_memory() && p != nullptr ? p : "";
}

}  // namespace polychip::runtime
