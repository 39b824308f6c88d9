// The formats a chat model writes tool calls and reasoning in, recognised from its chat template
// (the Jinja source of `tokenizer.chat_template`): the template tells the model how to call a
// tool, so the server must parse the answer, and force a call, in that same format. The names
// are those of `--reasoning-parser` and of the log line that says which format was chosen.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace polychip::server {

enum class ToolFormat {
  kGeneric,      // a bare {"name": ..., "arguments": ...} object (a template we do not know)
  kHermes,       // <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>  (Qwen2.5/3, Hermes)
  kQwen3Coder,   // <tool_call>\n<function=NAME>\n<parameter=P>\nv\n</parameter>\n</function>...
  kLlama3,       // {"name": ..., "parameters": ...}, optionally after <|python_tag|>
  kMistral,      // [TOOL_CALLS][{"name": ..., "arguments": ...}, ...]
  kMistralArgs,  // [TOOL_CALLS]NAME[ARGS]{...}
  kDeepSeekR1,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json...
  kDeepSeekV31,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
  kDeepSeekDsml,  // <｜DSML｜function_calls><｜DSML｜invoke name="N"><｜DSML｜parameter ...> (V3.2,
                  // V4)
  kGptOss,          // harmony: <|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>
  kFunctionaryV31,  // <function=NAME>{...}</function>
  kFunctionaryV32,  // >>>NAME\n{...}  (the generation prompt writes the first ">>>")
  kCommandR,        // Action:\n```json\n[{"tool_name": ..., "parameters": ...}]\n```
  kCommandR7b,      // <|START_ACTION|>[{"tool_call_id": ..., "tool_name": ..., "parameters": ...}]
  kGranite,         // <|tool_call|>[{"name": ..., "arguments": ...}]
  kKimiK2,  // <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_...
  kGlm4,    // <tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>
};

enum class ReasoningFormat {
  kNone,
  kThink,       // <think>...</think> (Qwen3, QwQ, DeepSeek R1, GLM, ...)
  kGptOss,      // harmony's analysis channel
  kMistral,     // [THINK]...[/THINK] (Magistral, Ministral reasoning)
  kCommandR7b,  // <|START_THINKING|>...<|END_THINKING|>
  kSeed,        // <seed:think>...</seed:think> (ByteDance Seed-OSS)
};

struct OutputFormat {
  ToolFormat tools = ToolFormat::kHermes;
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // The generation prompt may end inside reasoning (it writes "<think>\n"): the answer then
  // starts with the reasoning and only its end tag is written by the model.
  bool reasoning_opens_in_prompt = false;
};

std::string_view ToolFormatName(ToolFormat format);
std::optional<ToolFormat> ToolFormatFromName(std::string_view name);
std::string_view ReasoningFormatName(ReasoningFormat format);
std::optional<ReasoningFormat> ReasoningFormatFromName(std::string_view name);

// From the template's markers; kGeneric when it names none we know (the caller logs it).
ToolFormat DetectToolCallFormat(std::string_view jinja_source);
// kNone when the template shows no reasoning; `opens_in_prompt` (may be null) receives whether
// its generation prompt opens the reasoning block.
ReasoningFormat DetectReasoningFormat(std::string_view jinja_source, bool* opens_in_prompt);
OutputFormat DetectOutputFormat(std::string_view jinja_source);

// The format of a hand-written chat family (model::ChatFormatName) used where a file has no
// template: Llama 3's JSON calls for "llama3", Hermes for the others; <think> for "qwen3".
OutputFormat OutputFormatForChatFamily(std::string_view chat_format);

// The reasoning block's open and close markers ("" for kNone and kGptOss).
std::pair<std::string_view, std::string_view> ReasoningTags(ReasoningFormat format);

// Control-token texts the format is written with ("<|channel|>", "[TOOL_CALLS]", ...): the
// detokenizer must show them in the answer, or the parser (and a forcing grammar) cannot see
// them. Vocabularies that hold them as plain tokens render them anyway.
std::vector<std::string> FormatMarkerTokens(const OutputFormat& format);

}  // namespace polychip::server
