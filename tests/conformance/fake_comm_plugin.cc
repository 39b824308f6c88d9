// Exports only the comm entry point: the kit must recognise the kind and say that comm
// conformance is not implemented yet (non-zero exit), not mistake it for a broken backend.
#include "polychip/plugin/pc_comm.h"

extern "C" PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t, uint32_t,
                                                             const pc_host_services_t*) {
  return nullptr;
}
