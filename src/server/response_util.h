// Small pieces every part of the HTTP server writes responses with (internal to the module).
#pragma once

#include <atomic>
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

// "<prefix><16 hex digits>", unique within the process and unlikely to repeat across restarts.
inline std::string RandomId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return fmt::format("{}{:016x}", prefix, salt ^ (++counter * 0x9e3779b97f4a7c15ull));
}

inline int64_t UnixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace polychip::server
