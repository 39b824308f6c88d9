#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace polychip::runtime {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("runtime");
    if (l == nullptr) l = spdlog::stderr_color_mt("runtime");
    l->set_level(spdlog::get_level());
    return l;
  }();
  return *logger;
}

}  // namespace polychip::runtime
