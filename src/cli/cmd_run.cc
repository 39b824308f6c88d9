// `polychip run`: generates text from a prompt on one device. The generated text alone goes to
// stdout, streamed as tokens come (always valid UTF-8); logs and timings go to stderr.
// The default temperature is 0 (greedy), so that a run is deterministic unless asked otherwise.
#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/launch_flags.h"
#include "cli/model_options.h"
#include "dist/parallel.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/chat_template.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "launch/launch.h"

namespace polychip::cli {
namespace {

struct RunOptions {
  GivenFlags flags;  // the model and where it runs (launch/launch_options.h)
  std::string prompt;
  int n_predict = 128;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  float repeat_penalty = 1.f;
  int64_t seed = -1;
  bool chat = false;
  ChatTemplateFlags chat_template;
  bool special = false;
  bool ignore_eos = false;
  bool print_tokens = false;
  std::vector<std::string> stop;
};

constexpr uint32_t kScope = launch::kScopeModel | launch::kScopeParallel;

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One line per generated token on stderr, for tools comparing runs:
//   token <id> margin <best logit - second best> piece <hex bytes>
void PrintToken(int32_t token, const std::vector<float>& logits, const std::string& piece) {
  float best = -INFINITY, second = -INFINITY;
  for (float v : logits) {
    if (v > best) {
      second = best;
      best = v;
    } else if (v > second) {
      second = v;
    }
  }
  std::string hex;
  for (unsigned char ch : piece) hex += fmt::format("{:02x}", ch);
  std::fprintf(stderr, "token %d margin %.6f piece %s\n", token, best - second,
               hex.empty() ? "-" : hex.c_str());
}

// With speculative decoding the request runs through the engine, which drafts and verifies.
int RunSpeculative(const RunOptions& o, const launch::ResolvedLaunch& launch,
                   const model::ModelFile& mf, engine::ModelRunner& r,
                   const launch::OfflineLora& lora, const std::vector<int32_t>& prompt_ids,
                   const engine::SamplingParams& sp,
                   std::chrono::steady_clock::time_point t0,
                   std::chrono::steady_clock::time_point t_loaded) {
  using Clock = std::chrono::steady_clock;
  auto draft = launch::CreateDraft(launch, mf);
  if (!draft.ok()) return Fail(draft.status());
  const model::Tokenizer& tok = *mf.tokenizer;
  const bool special = o.special;
  engine::Engine eng(
      &r, launch.engine, [&tok, special](int32_t t) { return tok.Piece(t, special); },
      tok.eog_ids(), *draft ? (*draft)->runner.get() : nullptr);
  const Clock::time_point t_ready = Clock::now();  // the draft loaded too
  engine::GenerateInput in;
  in.rid = "run";
  in.prompt = prompt_ids;
  in.params = sp;
  in.params.want_logprob = false;
  in.adapter = lora.adapter;
  in.adapter_scale = lora.scale;
  auto stream = eng.Submit(in);
  if (!stream.ok()) return Fail(stream.status());
  Clock::time_point t_prompt = Clock::now();
  bool first = true, finished = false;
  int n_gen = 0;
  engine::StreamEvent last;
  while (!finished) {
    eng.Step();
    for (engine::StreamEvent& ev : (*stream)->Pop(std::chrono::milliseconds(0))) {
      if (first && !ev.tokens.empty()) {
        t_prompt = Clock::now();
        first = false;
      }
      n_gen += static_cast<int>(ev.tokens.size());
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
      if (ev.finished) {
        finished = true;
        last = std::move(ev);
      }
    }
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!last.error.ok()) return Fail(last.error);
  const auto t_end = Clock::now();
  // The first token comes with the prompt; generation counts the others.
  const double t_p = Seconds(t_ready, t_prompt), t_g = Seconds(t_prompt, t_end);
  const int n_after = std::max(n_gen - 1, 0);
  std::fprintf(stderr,
               "timings: load %.2f s | prompt %zu tokens, %.2f s, %.1f tok/s | "
               "generation %d tokens, %.2f s, %.1f tok/s\n",
               Seconds(t0, t_loaded) + Seconds(t_loaded, t_ready), prompt_ids.size(), t_p,
               t_p > 0 ? prompt_ids.size() / t_p : 0.0, n_gen, t_g,
               t_g > 0 ? n_after / t_g : 0.0);
  const engine::EngineStats st = eng.Stats();
  std::fprintf(stderr,
               "speculative: %s, k %d | %lld verification steps, %lld draft tokens, %lld "
               "accepted (acceptance %.3f) | %.2f tokens per verification step\n",
               engine::SpecAlgorithmName(launch.engine.speculative.algorithm),
               launch.engine.speculative.num_draft_tokens,
               static_cast<long long>(st.spec_verify_steps),
               static_cast<long long>(st.spec_draft_tokens),
               static_cast<long long>(st.spec_accepted_tokens),
               st.spec_draft_tokens ? double(st.spec_accepted_tokens) / st.spec_draft_tokens : 0.0,
               st.spec_verify_steps ? double(st.spec_emitted_tokens) / st.spec_verify_steps : 0.0);
  return 0;
}

int Run(const RunOptions& o, const GlobalOptions& globals) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto spec = BuildSpec(globals, kScope, o.flags, nullptr);
  if (!spec.ok()) return Fail(spec.status());
  if (spec->model_path.empty()) return Fail(InvalidArgument("--model-path is required"));
  if (Status s = launch::CheckModelPath(spec->model_path); !s.ok()) return Fail(s);
  auto mf = model::OpenModelFile(spec->model_path);
  if (!mf.ok()) return Fail(mf.status());
  const model::Tokenizer& tok = *mf->tokenizer;

  std::string prompt = o.prompt;
  model::EncodeOptions enc;
  enc.add_special = true;
  enc.parse_special = true;  // a prompt may spell control tokens, as llama.cpp's tools allow
  if (o.chat) {
    auto chat_options = ResolveChatTemplateFlags(o.chat_template);
    if (!chat_options.ok()) return Fail(chat_options.status());
    auto chat_template = model::ChatTemplate::ForModel(tok, *chat_options);
    if (!chat_template.ok()) return Fail(chat_template.status());
    model::ChatInput chat;
    chat.messages.push_back({{"role", "user"}, {"content", o.prompt}});
    auto rendered = chat_template->Render(chat);
    if (!rendered.ok()) return Fail(rendered.status());
    prompt = std::move(*rendered);
    enc.add_special = !chat_template->StartsWithBos(prompt);
    std::fprintf(stderr, "chat template: %s\n", chat_template->Describe().c_str());
  }
  const std::vector<int32_t> prompt_ids = tok.Encode(prompt, enc);
  if (prompt_ids.empty()) return Fail(InvalidArgument("the prompt is empty after tokenization"));

  const int64_t n_ctx = int64_t(prompt_ids.size()) + std::max(o.n_predict, 1);
  if (mf->config.n_ctx_train > 0 && n_ctx > mf->config.n_ctx_train) {
    std::fprintf(stderr, "warning: %lld positions exceed the training context %lld\n",
                 static_cast<long long>(n_ctx), static_cast<long long>(mf->config.n_ctx_train));
  }
  // One sequence of exactly the positions it needs.
  spec->context_length = n_ctx;
  spec->max_total_tokens = n_ctx;
  spec->max_running_requests = 1;
  // At least a speculative verification's positions (the last token and the drafts).
  spec->max_tokens_per_step = std::max<int64_t>(std::min<int64_t>(512, int64_t(prompt_ids.size())),
                                                spec->speculative_num_draft_tokens + 1);
  auto launch = launch::Resolve(*spec, *mf, nullptr);
  if (!launch.ok()) return Fail(launch.status());
  if (o.print_tokens && launch->engine.speculative.algorithm != engine::SpecAlgorithm::kNone) {
    // The engine verifying drafts hands back tokens, not the rows their margins come from.
    return Fail(InvalidArgument("--print-tokens prints each token's logit margin, which a "
                                "speculative run does not see; drop --speculative-* or "
                                "--print-tokens"));
  }
  auto lora = launch::LoadOfflineLora(*spec, mf->config);
  if (!lora.ok()) return Fail(lora.status());
  // tp_size x pp_size > 1: one process per rank (dist/parallel.h); in a rank other than 0 this call
  // never returns.
  auto runner = launch::CreateRunner(*launch, *mf, nullptr);
  if (!runner.ok()) return Fail(runner.status());
  engine::ModelRunner& r = **runner;
  const auto t_loaded = Clock::now();
  std::fprintf(stderr, "model: %s on %s, loaded in %.2f s\n", mf->config.Summary().c_str(),
               dist::DescribeRunner(r).c_str(), Seconds(t0, t_loaded));

  engine::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.min_p = o.min_p;
  sp.repetition_penalty = o.repeat_penalty;
  if (o.seed >= 0) sp.seed = static_cast<uint64_t>(o.seed);
  sp.max_tokens = o.n_predict;
  sp.ignore_eos = o.ignore_eos;
  sp.stop = o.stop;
  if (launch->engine.speculative.algorithm != engine::SpecAlgorithm::kNone) {
    return RunSpeculative(o, *launch, *mf, r, *lora, prompt_ids, sp, t0, t_loaded);
  }
  engine::Sampler sampler(sp, r.vocab_size(), tok.eog_ids(), prompt_ids);
  engine::StopChecker stop(sp, tok.eog_ids());

  // One sequence owning blocks 0..n-1.
  std::vector<int32_t> blocks(r.num_kv_blocks());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  std::vector<float> logits;
  engine::SequenceStep step;
  step.tokens = prompt_ids;
  step.start_pos = 0;
  step.block_table = blocks;
  step.logits = engine::LogitsMode::kLast;
  lora->Apply(step);
  if (Status s = r.Forward({&step, 1}, &logits); !s.ok()) return Fail(s);
  const auto t_prompt = Clock::now();

  int n_gen = 0;
  int32_t pos = static_cast<int32_t>(prompt_ids.size());
  int32_t token = 0;
  while (o.n_predict > 0) {
    token = sampler.Sample(logits).token;
    ++n_gen;
    if (o.print_tokens) PrintToken(token, logits, tok.Piece(token, true));
    const engine::StopChecker::Step out = stop.Push(token, tok.Piece(token, o.special));
    if (!out.text.empty()) {
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
    }
    if (out.finish != engine::FinishReason::kNone) break;
    step.tokens = {&token, 1};
    step.start_pos = pos++;
    if (Status s = r.Forward({&step, 1}, &logits); !s.ok()) return Fail(s);
  }
  const std::string rest = stop.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const auto t_end = Clock::now();

  const double t_p = Seconds(t_loaded, t_prompt), t_g = Seconds(t_prompt, t_end);
  std::fprintf(stderr,
               "timings: load %.2f s | prompt %zu tokens, %.2f s, %.1f tok/s | "
               "generation %d tokens, %.2f s, %.1f tok/s\n",
               Seconds(t0, t_loaded), prompt_ids.size(), t_p,
               t_p > 0 ? prompt_ids.size() / t_p : 0.0, n_gen, t_g, t_g > 0 ? n_gen / t_g : 0.0);
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& globals) {
  auto o = std::make_shared<RunOptions>();
  AddLaunchOptions(app, kScope, &o->flags);
  app.add_option("-p,--prompt", o->prompt, "prompt text")->required();
  app.add_option("-n,--n-predict", o->n_predict, "tokens to generate (default 128)");
  app.add_option("--temperature,--temp", o->temperature, "0 = greedy (default)");
  app.add_option("--top-k", o->top_k, "keep the k most likely tokens (0 = off)");
  app.add_option("--top-p", o->top_p, "nucleus sampling threshold (1 = off)");
  app.add_option("--min-p", o->min_p, "drop tokens below min_p * p(best) (0 = off)");
  app.add_option("--repeat-penalty", o->repeat_penalty, "repetition penalty (1 = off)");
  app.add_option("--seed", o->seed, "random seed (default: random)");
  app.add_option("--stop", o->stop, "stop string (repeatable)");
  app.add_flag("--chat", o->chat, "wrap the prompt in the model's chat template");
  AddChatTemplateOptions(app, &o->chat_template);
  app.add_flag("--special", o->special, "print control tokens' text");
  app.add_flag("--ignore-eos", o->ignore_eos, "continue past end-of-generation tokens");
  app.add_flag("--print-tokens", o->print_tokens,
               "print each generated token's id, logit margin and bytes on stderr");
  return [o, &globals] { return Run(*o, globals); };
}

const bool kRegistered = RegisterCommand({"run", "generate text from a prompt", Setup});

}  // namespace
}  // namespace polychip::cli
