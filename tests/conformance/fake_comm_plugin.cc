// Exports only the comm entry point, whose get_api returns NULL: the kit must recognise the
// kind (comm, not a broken backend) and fail its "load" row.
#include "polychip/plugin/pc_comm.h"

extern "C" PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t, uint32_t,
                                                             const pc_host_services_t*) {
  return nullptr;
}
