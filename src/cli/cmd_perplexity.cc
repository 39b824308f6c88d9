// `polychip perplexity`: the method of llama.cpp's llama-perplexity, so the two numbers can be
// compared directly:
//   - the whole file is tokenized once, with BOS when the vocabulary adds one;
//   - it is cut into non-overlapping chunks of n_ctx tokens (a partial last chunk is dropped);
//   - each chunk is evaluated from an empty KV cache, its first token replaced by BOS when the
//     vocabulary adds BOS;
//   - only the second half of each chunk is scored: the logits at positions
//     n_ctx/2 .. n_ctx-2 predict tokens n_ctx/2+1 .. n_ctx-1;
//   - after each chunk the running value is printed as "[i]ppl,", and the last line is
//     "Final estimate: PPL = <exp(mean nll)> +/- <stderr>", with the error
//     sqrt((E[nll^2] - E[nll]^2) / (count - 1)) * PPL.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/launch_flags.h"
#include "engine/sampler.h"
#include "dist/parallel.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "launch/launch.h"

namespace polychip::cli {
namespace {

struct PplOptions {
  GivenFlags flags;  // the model and where it runs (launch/launch_options.h)
  std::string file;
  int64_t ctx = 512;
  int64_t batch = 512;
  int64_t chunks = -1;
};

constexpr uint32_t kScope = launch::kScopeModel | launch::kScopeParallel;

int Run(const PplOptions& o, const GlobalOptions& globals) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (o.ctx < 4) return Fail(InvalidArgument("--ctx must be at least 4"));
  std::ifstream in(o.file, std::ios::binary);
  if (!in) return Fail(NotFound("cannot open " + o.file));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  auto spec = BuildSpec(globals, kScope, o.flags, nullptr);
  if (!spec.ok()) return Fail(spec.status());
  if (Status s = launch::RefuseSpeculation(*spec, "polychip perplexity",
                                           "it scores every position of the text in one pass");
      !s.ok()) {
    return Fail(s);
  }
  if (spec->model_path.empty()) return Fail(InvalidArgument("--model-path is required"));
  if (Status s = launch::CheckModelPath(spec->model_path); !s.ok()) return Fail(s);
  auto mf = model::OpenModelFile(spec->model_path);
  if (!mf.ok()) return Fail(mf.status());
  const model::Tokenizer& tok = *mf->tokenizer;
  if (tok.add_eos()) {
    return Fail(Unimplemented("perplexity of a vocabulary that appends EOS is not defined"));
  }

  // One chunk of --ctx positions at a time.
  spec->context_length = o.ctx;
  spec->max_total_tokens = o.ctx;
  spec->max_running_requests = 1;
  spec->max_tokens_per_step = std::max<int64_t>(1, std::min(o.batch, o.ctx));
  auto launch = launch::Resolve(*spec, *mf, nullptr);
  if (!launch.ok()) return Fail(launch.status());
  auto lora = launch::LoadOfflineLora(*spec, mf->config);
  if (!lora.ok()) return Fail(lora.status());
  // tp_size x pp_size > 1: one process per rank (dist/parallel.h); in a rank other than 0 this call
  // never returns.
  auto runner = launch::CreateRunner(*launch, *mf, nullptr);
  if (!runner.ok()) return Fail(runner.status());
  engine::ModelRunner& r = **runner;
  std::fprintf(stderr, "model: %s on %s, loaded in %.2f s\n", mf->config.Summary().c_str(),
               dist::DescribeRunner(r).c_str(),
               std::chrono::duration<double>(Clock::now() - t0).count());

  model::EncodeOptions enc;
  enc.add_special = true;
  enc.parse_special = false;
  std::vector<int32_t> tokens = tok.Encode(text, enc);
  const int64_t n_ctx = o.ctx;
  if (int64_t(tokens.size()) < 2 * n_ctx) {
    return Fail(InvalidArgument("need at least " + std::to_string(2 * n_ctx) +
                                " tokens for a context of " + std::to_string(n_ctx) + ", " +
                                o.file + " has " + std::to_string(tokens.size())));
  }
  int64_t n_chunk = int64_t(tokens.size()) / n_ctx;
  if (o.chunks >= 0) n_chunk = std::min(n_chunk, o.chunks);
  const int64_t first = n_ctx / 2;
  const int64_t vocab = r.vocab_size();
  std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld, scoring the second half\n",
               tokens.size(), static_cast<long long>(n_chunk), static_cast<long long>(n_ctx));

  std::vector<int32_t> blocks(r.num_kv_blocks());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  std::vector<float> logits;
  const auto t_start = Clock::now();
  for (int64_t i = 0; i < n_chunk; ++i) {
    std::vector<int32_t> chunk(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
    if (tok.add_bos()) chunk[0] = tok.bos();
    // The first half only fills the cache; the second half returns logits for every token.
    engine::SequenceStep steps[2];
    steps[0].tokens = std::span<const int32_t>(chunk).subspan(0, first);
    steps[0].start_pos = 0;
    steps[0].block_table = blocks;
    steps[0].logits = engine::LogitsMode::kNone;
    lora->Apply(steps[0]);
    steps[1] = steps[0];
    steps[1].tokens = std::span<const int32_t>(chunk).subspan(first);
    steps[1].start_pos = static_cast<int32_t>(first);
    steps[1].logits = engine::LogitsMode::kAll;
    std::vector<float> unused;
    if (Status s = r.Forward({&steps[0], 1}, &unused); !s.ok()) return Fail(s);
    if (Status s = r.Forward({&steps[1], 1}, &logits); !s.ok()) return Fail(s);
    for (int64_t j = 0; j < n_ctx - 1 - first; ++j) {
      const std::span<const float> row(logits.data() + j * vocab, vocab);
      const double v = -engine::LogSoftmaxAt(row, chunk[first + j + 1]);
      nll += v;
      nll2 += v * v;
    }
    count += n_ctx - 1 - first;
    if (i == 0) {
      const double t = std::chrono::duration<double>(Clock::now() - t_start).count();
      std::fprintf(stderr, "perplexity: %.2f seconds per pass - ETA %.2f minutes\n", t,
                   t * n_chunk / 60.0);
    }
    std::printf("[%lld]%.4lf,", static_cast<long long>(i + 1), std::exp(nll / count));
    std::fflush(stdout);
  }
  std::printf("\n");
  const double mean = nll / count;
  const double ppl = std::exp(mean);
  const double var = nll2 / count - mean * mean;
  if (var <= 0 || count < 2) {
    return Fail(Internal("unexpected non-positive variance of log(prob)"));
  }
  std::printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, std::sqrt(var / (count - 1)) * ppl);
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& globals) {
  auto o = std::make_shared<PplOptions>();
  AddLaunchOptions(app, kScope, &o->flags);
  app.add_option("-f,--file", o->file, "text file to score")->required();
  app.add_option("-c,--ctx", o->ctx, "tokens per chunk (default 512)");
  app.add_option("-b,--batch", o->batch, "tokens per forward step (default 512)");
  app.add_option("--chunks", o->chunks, "score at most this many chunks (default all)");
  return [o, &globals] { return Run(*o, globals); };
}

const bool kRegistered =
    RegisterCommand({"perplexity", "perplexity of a text file (llama-perplexity's method)", Setup});

}  // namespace
}  // namespace polychip::cli
