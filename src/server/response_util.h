// Small pieces every part of the HTTP server writes responses with (internal to the module).
#pragma once

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api.h"

namespace polychip::server {

inline std::string Dump(const nlohmann::json& j) {
  // Token pieces may be partial UTF-8 sequences: replace rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline ApiError Error(int status, std::string message,
                      std::string type = "invalid_request_error", std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  return e;
}

// "<prefix><32 hex digits>": 128 bits from the kernel's CSPRNG (getrandom), so that ids can
// be neither guessed nor repeated across restarts (a salted counter gave the same first id on
// every fresh server).
inline std::string RandomId(const char* prefix) {
  uint64_t r[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(r) + got, sizeof r - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    // EINTR: again. Anything else (no getrandom) cannot happen on the kernels we run on;
    // std::random_device is the fallback.
    if (n < 0 && errno != EINTR) {
      std::random_device dev;
      r[0] = (uint64_t{dev()} << 32) | dev();
      r[1] = (uint64_t{dev()} << 32) | dev();
      break;
    }
  }
  return fmt::format("{}{:016x}{:016x}", prefix, r[0], r[1]);
}

inline int64_t UnixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace polychip::server
