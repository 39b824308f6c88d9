// libFuzzer target: the Jinja engine on arbitrary template text and variables. Input: the
// template, then optionally "\n#####\n" and a JSON object of variables (ignored when it does
// not parse). Small limits, so that a slow input is a finding rather than a timeout.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "jinja/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t sep = input.find("\n#####\n");
  const std::string_view text = input.substr(0, sep);
  nlohmann::ordered_json vars = {
      {"messages",
       {{{"role", "system"}, {"content", "sys"}},
        {{"role", "user"}, {"content", "hi \"there\" é"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}}}},
        {{"role", "tool"}, {"content", "42"}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {}}}}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  if (sep != std::string_view::npos) {
    auto extra = nlohmann::ordered_json::parse(input.substr(sep + 7), nullptr, false);
    if (extra.is_object()) vars = std::move(extra);
  }
  auto tpl = polychip::jinja::Template::Parse(text, "fuzz");
  if (!tpl.ok()) return 0;
  polychip::jinja::RenderOptions options;
  options.limits.max_steps = 200'000;
  options.limits.max_output_bytes = 1u << 20;
  options.now = 0;
  auto out = tpl->Render(vars, options);
  // A refusal is an answer; a success must respect the output bound.
  if (out.ok() && out->size() > options.limits.max_output_bytes) __builtin_trap();
  return 0;
}
