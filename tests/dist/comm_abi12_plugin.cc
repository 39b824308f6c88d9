// A comm plugin as an ABI 1.2 build of it looks to the host: the table of the plugin named by
// POLYCHIP_TEST_WRAPPED_COMM (a path; the tests pass the shm plugin), cut before the members
// 1.3 appended (struct_size, abi_minor 2). Checks that the host reads the missing `reach` as
// unknown and that such a plugin still loads and works.
#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>

#include "polychip/plugin/pc_comm.h"

extern "C" {

PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t host_abi_major, uint32_t host_abi_minor,
                                                 const pc_host_services_t* host) {
  static pc_comm_iface_t table;
  const char* path = std::getenv("POLYCHIP_TEST_WRAPPED_COMM");
  if (path == nullptr) return nullptr;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // kept open for the process's life
  if (lib == nullptr) return nullptr;
  auto get_api = reinterpret_cast<pc_comm_get_api_fn>(dlsym(lib, PC_COMM_GET_API_SYMBOL));
  const pc_comm_iface_t* real = get_api ? get_api(host_abi_major, host_abi_minor, host) : nullptr;
  if (real == nullptr) return nullptr;
  table = *real;
  table.struct_size = offsetof(pc_comm_iface_t, reach);
  table.abi_minor = 2;
  table.name = "abi12";
  return &table;
}

}  // extern "C"
