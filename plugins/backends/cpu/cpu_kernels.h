// Kernels of the cpu plugin that are faster than the SDK reference. Everything else runs the
// reference kernels directly.
#pragma once

#include "polychip/plugin/pc_ops.h"

namespace polychip::cpu {

// out = x * W^T (+ bias) (+ out): parallel over weight rows, each weight row dequantized once
// and dotted against all m activation rows. Arguments already validated. nullptr = success.
const char* Matmul(const pc_matmul_args_t& a, int threads);

}  // namespace polychip::cpu
