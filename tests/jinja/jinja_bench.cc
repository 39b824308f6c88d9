// Render cost per request: the longest template of llama.cpp's models/templates with a
// 10-message conversation offering tools (tool calls and results included), rendered many
// times. Prints microseconds per render (and per parse); not a test, a measurement.
//
// Usage: jinja_bench [TEMPLATE_FILE] [ITERATIONS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/command.h"
#include "jinja/jinja.h"

namespace fs = std::filesystem;
using polychip::jinja::RenderOptions;
using polychip::jinja::Template;

int main(int argc, char** argv) {
  fs::path path = argc > 1 ? fs::path(argv[1]) : fs::path();
  const int iterations = argc > 2 ? std::max(1, std::atoi(argv[2])) : 2000;
  if (path.empty()) {
    const fs::path dir = polychip::testing::LlamaCppDir() / "models" / "templates";
    if (!fs::is_directory(dir)) {
      std::fprintf(stderr, "no template given and %s is missing\n", dir.c_str());
      return 1;
    }
    uintmax_t best = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".jinja" && e.file_size() > best) {
        best = e.file_size();
        path = e.path();
      }
    }
  }
  const std::string source = polychip::testing::ReadFile(path);
  const auto vars = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {
          "location": {"type": "string", "description": "City"},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}},
      {"type": "function", "function": {"name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
          "required": ["query"]}}}],
    "messages": [
      {"role": "system", "content": "You are a helpful assistant with tools."},
      {"role": "user", "content": "What's the weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"t\": 21}"},
      {"role": "assistant", "content": "It is 21 degrees in Paris."},
      {"role": "user", "content": "And search for museums there."},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_2", "type": "function",
        "function": {"name": "search", "arguments": {"query": "Paris museums"}}}]},
      {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "Louvre, Orsay"},
      {"role": "assistant", "content": "The Louvre and the Musee d'Orsay."},
      {"role": "user", "content": "Thanks! Which one is bigger?"}]})");
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto tpl = Template::Parse(source, path.filename().string());
  const double parse_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!tpl.ok()) {
    std::fprintf(stderr, "%s\n", tpl.status().message().c_str());
    return 1;
  }
  RenderOptions options;
  size_t bytes = 0;
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    t0 = Clock::now();
    auto out = tpl->Render(vars, options);
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!out.ok()) {
      std::fprintf(stderr, "%s\n", out.status().message().c_str());
      return 1;
    }
    bytes = out->size();
  }
  std::sort(samples.begin(), samples.end());
  std::printf("%s (%zu bytes of template, %zu bytes rendered, 10 messages, 2 tools)\n",
              path.filename().c_str(), source.size(), bytes);
  std::printf("parse: %.0f us; render: median %.1f us, p90 %.1f us over %d renders\n", parse_us,
              samples[samples.size() / 2], samples[samples.size() * 9 / 10], iterations);
  return 0;
}
