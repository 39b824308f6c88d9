#include "server/tool_format.h"

#include <array>
#include <utility>

namespace polychip::server {
namespace {

constexpr std::array<std::pair<ToolFormat, std::string_view>, 17> kToolNames = {{
    {ToolFormat::kGeneric, "generic"},
    {ToolFormat::kHermes, "hermes"},
    {ToolFormat::kQwen3Coder, "qwen3-coder"},
    {ToolFormat::kLlama3, "llama3"},
    {ToolFormat::kMistral, "mistral"},
    {ToolFormat::kMistralArgs, "mistral-args"},
    {ToolFormat::kDeepSeekR1, "deepseek-r1"},
    {ToolFormat::kDeepSeekV31, "deepseek-v3.1"},
    {ToolFormat::kDeepSeekDsml, "deepseek-dsml"},
    {ToolFormat::kGptOss, "gpt-oss"},
    {ToolFormat::kFunctionaryV31, "functionary-v3.1"},
    {ToolFormat::kFunctionaryV32, "functionary-v3.2"},
    {ToolFormat::kCommandR, "command-r"},
    {ToolFormat::kCommandR7b, "command-r7b"},
    {ToolFormat::kGranite, "granite"},
    {ToolFormat::kKimiK2, "kimi-k2"},
    {ToolFormat::kGlm4, "glm4"},
}};

constexpr std::array<std::pair<ReasoningFormat, std::string_view>, 6> kReasoningNames = {{
    {ReasoningFormat::kNone, "none"},
    {ReasoningFormat::kThink, "think"},
    {ReasoningFormat::kGptOss, "gpt-oss"},
    {ReasoningFormat::kMistral, "mistral"},
    {ReasoningFormat::kCommandR7b, "command-r7b"},
    {ReasoningFormat::kSeed, "seed"},
}};

bool Has(std::string_view s, std::string_view marker) {
  return s.find(marker) != std::string_view::npos;
}

}  // namespace

std::string_view ToolFormatName(ToolFormat format) {
  for (const auto& [f, n] : kToolNames) {
    if (f == format) return n;
  }
  return "generic";
}

std::optional<ToolFormat> ToolFormatFromName(std::string_view name) {
  for (const auto& [f, n] : kToolNames) {
    if (n == name) return f;
  }
  return std::nullopt;
}

std::string_view ReasoningFormatName(ReasoningFormat format) {
  for (const auto& [f, n] : kReasoningNames) {
    if (f == format) return n;
  }
  return "none";
}

std::optional<ReasoningFormat> ReasoningFormatFromName(std::string_view name) {
  for (const auto& [f, n] : kReasoningNames) {
    if (n == name) return f;
  }
  if (name == "deepseek-r1" || name == "qwen3") return ReasoningFormat::kThink;  // vLLM's names
  return std::nullopt;
}

ToolFormat DetectToolCallFormat(std::string_view t) {
  // Most specific first: several families share "<tool_call>" or "<function=".
  if (Has(t, "<|channel|>") && Has(t, "functions.")) return ToolFormat::kGptOss;
  if (Has(t, "DSML")) return ToolFormat::kDeepSeekDsml;
  if (Has(t, "tool▁calls▁begin")) {
    // R1 writes the call's type and a ```json fence; V3.1 the name then the arguments.
    return Has(t, "```json") ? ToolFormat::kDeepSeekR1 : ToolFormat::kDeepSeekV31;
  }
  if (Has(t, "<|tool_calls_section_begin|>")) return ToolFormat::kKimiK2;
  if (Has(t, "<arg_key>")) return ToolFormat::kGlm4;
  if (Has(t, "[TOOL_CALLS]")) {
    return Has(t, "[ARGS]") ? ToolFormat::kMistralArgs : ToolFormat::kMistral;
  }
  if (Has(t, "<|START_ACTION|>")) return ToolFormat::kCommandR7b;
  if (Has(t, "Action:") && Has(t, "tool_name")) return ToolFormat::kCommandR;
  if (Has(t, "<|tool_call|>")) return ToolFormat::kGranite;
  if (Has(t, ">>>") && Has(t, "recipient")) return ToolFormat::kFunctionaryV32;
  if (Has(t, "<function=") && !Has(t, "<seed:tool_call>")) {
    return Has(t, "<tool_call>") ? ToolFormat::kQwen3Coder : ToolFormat::kFunctionaryV31;
  }
  if (Has(t, "<tool_call>")) return ToolFormat::kHermes;
  if (Has(t, "<|python_tag|>") || (Has(t, "<|start_header_id|>") && Has(t, "\"parameters\"")) ||
      (Has(t, "<|start_header_id|>") && Has(t, "ipython"))) {
    return ToolFormat::kLlama3;
  }
  return ToolFormat::kGeneric;
}

ReasoningFormat DetectReasoningFormat(std::string_view t, bool* opens_in_prompt) {
  if (opens_in_prompt) *opens_in_prompt = false;
  if (Has(t, "<|channel|>") && Has(t, "analysis")) return ReasoningFormat::kGptOss;
  if (Has(t, "[THINK]")) return ReasoningFormat::kMistral;
  if (Has(t, "<|START_THINKING|>")) return ReasoningFormat::kCommandR7b;
  if (Has(t, "<seed:think>")) return ReasoningFormat::kSeed;
  if (!Has(t, "<think>") && !Has(t, "</think>")) return ReasoningFormat::kNone;
  if (opens_in_prompt) {
    // After the last add_generation_prompt, a "<think>" that is not closed right away ("<think>
    // </think>" is how templates switch thinking off) opens the answer's reasoning.
    const size_t gen = t.rfind("add_generation_prompt");
    std::string_view tail = gen == std::string_view::npos ? std::string_view() : t.substr(gen);
    for (size_t at = tail.find("<think>"); at != std::string_view::npos;
         at = tail.find("<think>", at + 1)) {
      size_t i = at + 7;
      while (i < tail.size()) {
        if (tail[i] == ' ' || tail[i] == '\n') {
          ++i;
        } else if (tail.substr(i, 2) == "\\n") {
          i += 2;
        } else {
          break;
        }
      }
      if (tail.substr(i, 8) != "</think>") {
        *opens_in_prompt = true;
        break;
      }
    }
  }
  return ReasoningFormat::kThink;
}

OutputFormat DetectOutputFormat(std::string_view jinja_source) {
  OutputFormat f;
  f.tools = DetectToolCallFormat(jinja_source);
  f.reasoning = DetectReasoningFormat(jinja_source, &f.reasoning_opens_in_prompt);
  return f;
}

OutputFormat OutputFormatForChatFamily(std::string_view chat_format) {
  OutputFormat f;
  f.tools = chat_format == "llama3" ? ToolFormat::kLlama3 : ToolFormat::kHermes;
  if (chat_format == "qwen3") f.reasoning = ReasoningFormat::kThink;
  return f;
}

std::pair<std::string_view, std::string_view> ReasoningTags(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kThink:
      return {"<think>", "</think>"};
    case ReasoningFormat::kMistral:
      return {"[THINK]", "[/THINK]"};
    case ReasoningFormat::kCommandR7b:
      return {"<|START_THINKING|>", "<|END_THINKING|>"};
    case ReasoningFormat::kSeed:
      return {"<seed:think>", "</seed:think>"};
    case ReasoningFormat::kNone:
    case ReasoningFormat::kGptOss:
      break;
  }
  return {"", ""};
}

std::vector<std::string> FormatMarkerTokens(const OutputFormat& format) {
  std::vector<std::string> out;
  auto [open, close] = ReasoningTags(format.reasoning);
  if (!open.empty()) {
    out.emplace_back(open);
    out.emplace_back(close);
  }
  switch (format.tools) {
    case ToolFormat::kHermes:
    case ToolFormat::kQwen3Coder:
    case ToolFormat::kGlm4:
      out.insert(out.end(), {"<tool_call>", "</tool_call>"});
      break;
    case ToolFormat::kLlama3:
    case ToolFormat::kFunctionaryV31:
      out.emplace_back("<|python_tag|>");
      break;
    case ToolFormat::kMistral:
    case ToolFormat::kMistralArgs:
      out.insert(out.end(), {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"});
      break;
    case ToolFormat::kDeepSeekR1:
    case ToolFormat::kDeepSeekV31:
      out.insert(out.end(), {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                             "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"});
      break;
    case ToolFormat::kGptOss:
      out.insert(out.end(),
                 {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"});
      break;
    case ToolFormat::kCommandR7b:
      out.insert(out.end(),
                 {"<|START_ACTION|>", "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"});
      break;
    case ToolFormat::kGranite:
      out.emplace_back("<|tool_call|>");
      break;
    case ToolFormat::kKimiK2:
      out.insert(out.end(),
                 {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                  "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"});
      break;
    case ToolFormat::kGeneric:
    case ToolFormat::kDeepSeekDsml:
    case ToolFormat::kFunctionaryV32:
    case ToolFormat::kCommandR:
      break;
  }
  return out;
}

}  // namespace polychip::server
