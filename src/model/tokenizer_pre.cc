#include "model/tokenizer_pre.h"

#include <initializer_list>

namespace polychip::model {
namespace {

// GPT-2's pattern; several families put extra splits in front of it.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3: letters may take one leading non-letter, digits in groups of up to three.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama 3 but single digits.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5: combining marks stay with their letters.
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kPoro = R"( ?[^(\s|.,!?…。，、।۔،)]+)";
constexpr const char* kCjk = R"([一-龥ࠀ-一가-퟿]+)";

PreTokenizerSpec Spec(std::initializer_list<const char*> regexes, bool clean_spaces = true) {
  PreTokenizerSpec spec;
  for (const char* r : regexes) spec.regexes.emplace_back(r);
  spec.clean_spaces = clean_spaces;
  return spec;
}

bool OneOf(std::string_view name, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

StatusOr<PreTokenizerSpec> LookupPreTokenizer(std::string_view pre) {
  if (pre.empty() || pre == "default") {
    return Spec({R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"});
  }
  if (OneOf(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                  "midm-2.0", "lfm2"})) {
    PreTokenizerSpec spec = Spec({kLlama3});
    spec.ignore_merges = true;
    spec.add_bos = true;
    return spec;
  }
  if (OneOf(pre, {"dbrx", "smaug-bpe"})) return Spec({kLlama3});
  if (OneOf(pre, {"chatglm-bpe", "glm4"})) return Spec({kLlama3});
  if (pre == "deepseek-llm") {
    return Spec({R"([\r\n])",
                 R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)",
                 R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)",
                 R"(\s+$)", kCjk, R"(\p{N}+)"},
                /*clean_spaces=*/false);
  }
  if (pre == "deepseek-coder") {
    return Spec({R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"},
                /*clean_spaces=*/false);
  }
  if (pre == "falcon") return Spec({R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"});
  if (OneOf(pre, {"starcoder", "refact", "smollm", "codeshell", "exaone", "minerva"})) {
    return Spec({R"(\p{N})", kGpt2});
  }
  if (pre == "command-r") return Spec({R"(\p{N})", kGpt2}, /*clean_spaces=*/false);
  if (OneOf(pre, {"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat",
                  "jina-v2-es", "jina-v2-de", "jina-v1-en", "jina-v2-code", "roberta-bpe",
                  "a.x-4.0", "mellum", "modern-bert", "trillion"})) {
    return Spec({kGpt2});
  }
  if (OneOf(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "hunyuan"})) {
    return Spec({kQwen2}, /*clean_spaces=*/false);
  }
  if (pre == "stablelm2") return Spec({kQwen2});
  if (pre == "qwen35") return Spec({kQwen35}, /*clean_spaces=*/false);
  if (OneOf(pre, {"poro-chat", "bloom", "gpt3-finnish"})) return Spec({kPoro}, false);
  if (pre == "viking") return Spec({kPoro, R"(\p{N})"});
  if (pre == "gemma4") {
    PreTokenizerSpec spec = Spec({R"([^\n]+|[\n]+)"});
    spec.escape_whitespace = true;
    spec.byte_encode = false;
    spec.whole_newline_runs = true;
    spec.add_bos = true;
    return spec;
  }
  return NotFound("unknown pre-tokenizer '" + std::string(pre) + "' (tokenizer.ggml.pre)");
}

}  // namespace polychip::model
