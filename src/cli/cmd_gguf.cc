// `polychip gguf info FILE` and `polychip gguf synth ...`: inspect a GGUF file; write a
// random-weight model of a real shape with a real tokenizer.
#include <CLI/CLI.hpp>


#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "model/arch.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_shapes.h"
#include "model/quantize.h"
#include "model/lora.h"
#include "model/synth.h"
#include "util/file.h"

namespace polychip::cli {
namespace {

using model::GgufType;
using model::GgufValue;

// Printable form of a string: escapes control bytes, truncates long ones.
std::string Printable(std::string_view s, size_t max = 60) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (c < 32) out += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    else out += static_cast<char>(c);
  }
  if (s.size() > max) out += "...";
  return out + "\"";
}

std::string ScalarString(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kString: return Printable(v.str);
    case GgufType::kBool: return v.u ? "true" : "false";
    case GgufType::kF32: case GgufType::kF64: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", v.f);
      return buf;
    }
    case GgufType::kU64: return std::to_string(v.u);
    default: return std::to_string(v.i);
  }
}

// Arrays are abbreviated to their first few elements.
std::string ValueString(const GgufValue& v) {
  if (v.type != GgufType::kArray) return ScalarString(v);
  constexpr uint64_t kShown = 6;
  std::string s = "[";
  uint64_t n = std::min(v.count, kShown);
  for (uint64_t k = 0; k < n; ++k) {
    if (k) s += ", ";
    if (v.elem_type == GgufType::kString) {
      s += Printable(v.strings[k], 24);
    } else if (v.elem_type == GgufType::kArray) {
      s += ValueString(v.items[k]);
    } else {
      GgufValue e;
      e.type = v.elem_type;
      e.i = v.IntAt(k);
      e.u = static_cast<uint64_t>(e.i);
      e.f = v.FloatAt(k);
      s += ScalarString(e);
    }
  }
  if (v.count > kShown) s += ", ...";
  return s + "]";
}

std::string TypeString(const GgufValue& v) {
  if (v.type != GgufType::kArray) return model::GgufTypeName(v.type);
  return std::string("array[") + model::GgufTypeName(v.elem_type) + " x " +
         std::to_string(v.count) + "]";
}

int Error(const Status& s) {
  std::fprintf(stderr, "polychip: error: %s\n", s.message().c_str());
  return 1;
}

int RunInfo(const std::string& path, bool show_all_tensors) {
  auto opened = model::GgufFile::Open(path);
  if (!opened.ok()) return Error(opened.status());
  const model::GgufFile& f = **opened;
  std::printf("%s: GGUF v%u, %.1f MiB, alignment %llu, %zu metadata keys, %zu tensors\n",
              path.c_str(), f.version(), f.file_size() / 1048576.0,
              static_cast<unsigned long long>(f.alignment()), f.metadata().size(),
              f.tensors().size());
  std::printf("\nmetadata:\n");
  for (const auto& [key, value] : f.metadata()) {
    std::printf("  %-44s %-22s = %s\n", key.c_str(), TypeString(value).c_str(),
                ValueString(value).c_str());
  }
  if (!f.tensors().empty()) {
    std::printf("\ntensors:\n  %5s  %-36s %-5s %-22s %12s %12s\n", "#", "name", "type", "shape",
                "bytes", "offset");
    size_t n = f.tensors().size();
    for (size_t i = 0; i < n; ++i) {
      // Long tables: first and last tensors unless --all.
      if (!show_all_tensors && n > 40 && i == 20) {
        std::printf("  ... %zu more (--all to list them)\n", n - 30);
        i = n - 10;
      }
      const model::GgufTensor& t = f.tensors()[i];
      std::printf("  %5zu  %-36s %-5s %-22s %12llu %12llu\n", i, t.name.c_str(),
                  DTypeName(t.dtype), t.ShapeString().c_str(),
                  static_cast<unsigned long long>(t.n_bytes),
                  static_cast<unsigned long long>(f.data_offset() + t.offset));
    }
    auto config = model::ModelConfig::FromGguf(f);
    if (config.ok()) {
      std::printf("\nmodel: %s\n", config->Summary().c_str());
    } else {
      std::printf("\nmodel: not loadable: %s\n", config.status().message().c_str());
    }
  }
  return 0;
}

// Validates a model file: exit 0 and a summary line when it loads as a supported model.
int RunCheck(const std::string& path) {
  auto opened = model::GgufFile::Open(path);
  if (!opened.ok()) return Error(opened.status());
  auto config = model::ModelConfig::FromGguf(**opened);
  if (!config.ok()) {
    return Error(Status(config.status().code(), path + ": " + config.status().message()));
  }
  std::printf("%s: %s\n", path.c_str(), config->Summary().c_str());
  return 0;
}

struct SynthArgs {
  std::string vocab, shape, arch, type = "F16", out, chat_template_file;
  int64_t layers = 0, embd = 0, heads = 0, kv_heads = 0, ff = 0, ctx = 0;
  uint64_t seed = 42;
  float weight_std = 0.02f;
  int threads = 0;
  bool quiet = false;
  // A LoRA adapter for this base instead of a model.
  std::string lora_for, lora_targets = "attn,ffn,output";
  int64_t lora_rank = 8;
  float lora_alpha = 16;
};

int RunSynthLora(const SynthArgs& a) {
  auto base = model::GgufFile::Open(a.lora_for);
  if (!base.ok()) return Error(base.status());
  model::LoraSynthOptions opts;
  opts.rank = a.lora_rank;
  opts.alpha = a.lora_alpha;
  opts.seed = a.seed;
  opts.std = a.weight_std;
  auto type = DTypeFromName(a.type);
  if (!type) return Error(InvalidArgument("unknown --type '" + a.type + "'"));
  opts.type = *type;
  opts.targets.clear();
  for (size_t at = 0; at <= a.lora_targets.size();) {
    size_t comma = a.lora_targets.find(',', at);
    if (comma == std::string::npos) comma = a.lora_targets.size();
    if (comma > at) opts.targets.push_back(a.lora_targets.substr(at, comma - at));
    at = comma + 1;
  }
  if (Status s = model::SynthesizeLora(**base, opts, a.out); !s.ok()) return Error(s);
  if (!a.quiet) {
    std::fprintf(stderr, "LoRA adapter rank %lld alpha %g (%s) for %s -> %s\n",
                 static_cast<long long>(a.lora_rank), a.lora_alpha, a.type.c_str(),
                 a.lora_for.c_str(), a.out.c_str());
  }
  return 0;
}

int RunSynth(const SynthArgs& a) {
  if (!a.lora_for.empty()) return RunSynthLora(a);
  if (a.vocab.empty()) return Error(InvalidArgument("--vocab is required (or --lora-for BASE)"));
  model::SynthOptions opts;
  opts.vocab_path = a.vocab;
  opts.seed = a.seed;
  opts.weight_std = a.weight_std;
  opts.threads = a.threads;
  opts.progress = !a.quiet;
  if (!a.chat_template_file.empty()) {
    auto text = ReadFileToString(a.chat_template_file, "chat template file");
    if (!text.ok()) return Error(text.status());
    opts.chat_template = std::move(*text);
  }
  auto scheme = model::ParseQuantScheme(a.type);
  if (!scheme.ok()) return Error(scheme.status());
  opts.type = scheme->type;
  opts.mix = scheme->mix;

  model::ModelConfig& c = opts.config;
  if (!a.shape.empty()) {
    auto preset = model::ShapePreset(a.shape);
    if (!preset.ok()) return Error(preset.status());
    c = *preset;
  } else if (a.arch.empty() || a.layers <= 0 || a.embd <= 0 || a.heads <= 0 || a.ff <= 0) {
    return Error(InvalidArgument("give --shape NAME, or --arch, --layers, --embd, --heads and "
                                 "--ff (and optionally --kv-heads)"));
  } else {
    c.n_ctx_train = 2048;
    c.rms_eps = 1e-5f;
    c.name = "custom";
  }
  if (!a.arch.empty()) {
    auto arch = model::ArchFromName(a.arch);
    if (!arch.ok()) return Error(arch.status());
    Status adopted = model::AdoptArch(*arch, c);
    if (!adopted.ok()) return Error(adopted);
  }
  bool resized = a.embd > 0 || a.heads > 0;
  if (a.layers > 0) c.n_layer = a.layers;
  if (a.embd > 0) c.n_embd = a.embd;
  if (a.heads > 0) c.n_head = a.heads;
  if (a.kv_heads > 0) c.n_head_kv = a.kv_heads;
  if (c.n_head_kv <= 0 || c.n_head_kv > c.n_head) c.n_head_kv = c.n_head;
  if (a.ff > 0) c.n_ff = a.ff;
  if (a.ctx > 0) c.n_ctx_train = a.ctx;
  if (resized || c.head_dim <= 0) {
    c.head_dim = c.head_dim_v = c.n_rot = c.n_head > 0 ? c.n_embd / c.n_head : 0;
  }
  Status s = model::SynthesizeModel(opts, a.out);
  if (!s.ok()) return Error(s);
  if (!a.quiet) std::fprintf(stderr, "wrote %s\n", a.out.c_str());
  return 0;
}

std::function<int()> SetupGguf(CLI::App& app, const GlobalOptions&) {
  app.require_subcommand(1);
  auto info_path = std::make_shared<std::string>();
  auto info_all = std::make_shared<bool>(false);
  CLI::App* info = app.add_subcommand("info", "print a GGUF file's metadata and tensor table");
  info->add_option("file", *info_path, "GGUF file")->required();
  info->add_flag("--all", *info_all, "list every tensor");

  auto check_path = std::make_shared<std::string>();
  CLI::App* check = app.add_subcommand("check", "validate a model file (architecture, tensors)");
  check->add_option("file", *check_path, "GGUF model")->required();

  auto sa = std::make_shared<SynthArgs>();
  std::string shapes;
  for (const std::string& n : model::ShapePresetNames()) shapes += (shapes.empty() ? "" : "|") + n;
  CLI::App* synth = app.add_subcommand(
      "synth", "write a random-weight model of a real shape with a vocabulary's tokenizer");
  synth->add_option("--vocab", sa->vocab,
                    "vocabulary GGUF (tokenizer.* keys are copied); required for a model");
  synth->add_option("--shape", sa->shape, "named shape: " + shapes);
  synth->add_option("--arch", sa->arch, model::ArchNames("|") + " (overrides the shape's)");
  synth->add_option("--layers", sa->layers, "number of blocks");
  synth->add_option("--embd", sa->embd, "embedding width");
  synth->add_option("--heads", sa->heads, "attention heads");
  synth->add_option("--kv-heads", sa->kv_heads, "key/value heads (GQA)");
  synth->add_option("--ff", sa->ff, "feed-forward width");
  synth->add_option("--ctx", sa->ctx, "training context length to record");
  synth->add_option("--type", sa->type,
                    "weight type (F32, F16, BF16, Q8_0, Q4_0, Q4_K, ...) or a llama-quantize "
                    "mixture (Q4_K_M, Q5_K_M, Q3_K_M, ...)");
  synth->add_option("--out", sa->out, "output GGUF")->required();
  synth->add_option("--seed", sa->seed, "random seed");
  synth->add_option("--chat-template-file", sa->chat_template_file,
                    "a Jinja file written as tokenizer.chat_template (default: the vocabulary's)");
  synth->add_option("--weight-std", sa->weight_std,
                    "standard deviation of the random weights (default 0.02; larger gives "
                    "peakier logits, as tests comparing greedy tokens want)");
  synth->add_option("--threads", sa->threads, "worker threads (0: all cores)");
  synth->add_flag("-q,--quiet", sa->quiet, "no progress output");
  synth->add_option("--lora-for", sa->lora_for,
                    "write a random LoRA adapter (llama.cpp's GGUF layout) for this base model "
                    "instead of a model; --type F32, F16, BF16 or Q8_0, --weight-std its A and B");
  synth->add_option("--lora-rank", sa->lora_rank, "the adapter's rank (default 8)");
  synth->add_option("--lora-alpha", sa->lora_alpha, "adapter.lora.alpha (default 16)");
  synth->add_option("--lora-targets", sa->lora_targets,
                    "adapted matrices: attn, ffn, experts (a mixture of experts' ffn_*_exps), output, "
                    "comma-separated (default attn,ffn,output)");

  return [info, check, synth, info_path, info_all, check_path, sa]() {
    if (info->parsed()) return RunInfo(*info_path, *info_all);
    if (check->parsed()) return RunCheck(*check_path);
    if (synth->parsed()) return RunSynth(*sa);
    return 2;
  };
}

const bool kRegistered = RegisterCommand({"gguf", "inspect or synthesize GGUF model files", SetupGguf});

}  // namespace
}  // namespace polychip::cli
