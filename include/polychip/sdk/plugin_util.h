// polychip SDK — small helpers every plugin needs: error objects, noexcept trampolines and
// parameter parsing. Header-only, so each plugin gets its own private copy (plugins are built
// with hidden visibility; nothing here is exported).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "polychip/plugin/pc_common.h"

// The ABI leaves pc_error opaque; every plugin defines it for itself. This is ours.
struct pc_error {
  pc_code_t code;
  std::string message;
};

namespace polychip::sdk {

inline pc_error_t* MakeError(pc_code_t code, std::string message) {
  return new (std::nothrow) pc_error{code, std::move(message)};
}

// The three error members of a backend/comm table, ready to be put in it.
inline pc_code_t ErrorCode(const pc_error_t* e) noexcept { return e ? e->code : PC_CODE_OK; }
inline const char* ErrorMessage(const pc_error_t* e) noexcept {
  return e ? e->message.c_str() : "";
}
inline void ErrorDestroy(pc_error_t* e) noexcept { delete e; }

// Runs `body` (returning pc_error_t*) and turns any escaping exception into an error object:
// every exported entry goes through this so no exception crosses the C boundary.
template <typename F>
pc_error_t* Guard(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "out of host memory");
  } catch (const std::exception& e) {
    return MakeError(PC_CODE_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return MakeError(PC_CODE_INTERNAL, "internal error: unknown exception");
  }
}

// Copies `filled` into the caller's `out`, which may be an older, shorter version of the struct
// (every ABI struct begins with struct_size and only appends members): the members after
// struct_size that out->struct_size declares, no more; out->struct_size stays the caller's.
// The caller's struct_size must hold at least itself (check it before filling).
template <typename T>
void CopyToCallerStruct(const T& filled, T* out) noexcept {
  static_assert(offsetof(T, struct_size) == 0, "an ABI struct begins with struct_size");
  const size_t n = std::min<size_t>(out->struct_size, sizeof(T));
  if (n <= sizeof(out->struct_size)) return;
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(out->struct_size),
              reinterpret_cast<const char*>(&filled) + sizeof(out->struct_size),
              n - sizeof(out->struct_size));
}

// Parses a non-negative integer parameter; false for garbage.
inline bool ParseInt(const char* text, long long* out) {
  if (text == nullptr || *text == 0) return false;
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (*end != 0 || v < 0) return false;
  *out = v;
  return true;
}

}  // namespace polychip::sdk
