// polychip SDK — what a comm plugin needs beyond moving bytes: the size of an element type and
// reductions done on the host (for plugins whose transport has no reduction of its own, and for
// the F16/BF16 that some transports, MPI among them, cannot reduce).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "polychip/plugin/pc_comm.h"

namespace polychip::sdk {

// Bytes per element of a dtype a collective can carry element by element; 0 for the
// block-quantized types (they have no element-wise meaning) and unknown ones.
size_t ElementSize(pc_dtype_t dtype);

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n_src - 1][i], for i < count, combined in
// this order so that every rank reducing the same inputs gets bit-identical results. F16 and
// BF16 accumulate in F32 and round once; integers accumulate in 64 bits and wrap when stored
// back (no signed-overflow UB). dst may be one of the sources: each element is read from every
// source before it is written. A dtype with ElementSize 0 leaves dst untouched.
void Reduce(pc_dtype_t dtype, pc_reduce_op_t op, const uint8_t* const* srcs, int32_t n_src,
            void* dst, uint64_t count);

// F16 or BF16 (`dtype`) values widened to F32, for a transport that reduces only F32.
std::vector<float> WidenToF32(pc_dtype_t dtype, const void* src, uint64_t count);
// The inverse: F32 values rounded (to nearest even) into F16 or BF16 at dst.
void NarrowFromF32(pc_dtype_t dtype, const std::vector<float>& src, void* dst);

}  // namespace polychip::sdk
