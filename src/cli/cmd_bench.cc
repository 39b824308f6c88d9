// `polychip bench`: llama-bench-style throughput of a model on one device.
//   pp<P>      prompt processing: one sequence's P-token prompt in one step, tokens/s
//   tg<N>      generation: N single-token steps of one sequence from an empty cache, tokens/s
//   pp<P>+tg<N>@B  with --batch B > 1: B sequences each prefilled with P tokens (not timed),
//              then N steps decoding all B together; aggregate generated tokens/s
//   tg<N> engine, tg<N> engine+spec  with --speculative-*: B requests (random P-token prompts,
//              greedy, N tokens each) through the engine, prefill not timed, without and with
//              speculative decoding; generated tokens/s, and for the second the draft
//              acceptance and tokens per verification step (docs/speculative-decoding.md)
// Each test runs once to warm up, then -r times; the result is mean ± stdev over repetitions.
// With --lora and --lora-vs-base, every decode position runs twice, with the adapters and
// without them, in alternating order, each timed apart: tg<N> (or pp<P>+tg<N>@B) and the same
// test with " base" appended come from the same moments of one process, so their ratio is the
// adapters' cost even where the host's bandwidth drifts between runs (docs/lora.md).
// `-o json` prints a JSON array of records using llama-bench's field names (n_prompt, n_gen,
// n_threads, avg_ts, stddev_ts, ...) so a script can compare the two tools, plus ops_per_step:
// the plugin's per-op counters per forward step (docs/profiling.md). `--membw` measures
// the host's read bandwidth instead (the roofline for decode on a host-memory device).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/launch_flags.h"
#include "cli/profiling.h"
#include "engine/engine.h"
#include "launch/launch.h"
#include "model/quantize.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/op_counters.h"

namespace polychip::cli {
namespace {

struct BenchOptions {
  GivenFlags flags;  // the model and where it runs (launch/launch_options.h)
  int n_prompt = 128;
  int n_gen = 64;
  int depth = 0;  // positions already in the cache before each test (llama-bench's -d)
  int reps = 3;
  int batch = 1;
  std::string output = "md";
  bool membw = false;
  int membw_mib = 1024;
  bool lora_vs_base = false;
};

struct Record {
  std::string test;  // "pp128", "tg64", "pp128+tg64@16", "tg64 @ d4096"
  int n_prompt = 0, n_gen = 0, n_seqs = 1;
  int n_depth = 0;
  std::vector<double> ts;  // tokens/s per repetition
  std::vector<double> ns;  // nanoseconds per repetition
  // The plugin's per-op counters over the timed repetitions (absent without them), and the
  // forward steps they cover.
  std::optional<std::vector<runtime::OpCounters>> ops;
  int op_steps = 0;
  // Speculative decoding over the timed repetitions (the engine tests): verification steps,
  // draft tokens proposed, accepted, and tokens the verifications emitted.
  bool speculative = false;
  int64_t spec_verify_steps = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0,
          spec_emitted_tokens = 0;
  double AcceptanceRate() const {
    return spec_draft_tokens ? double(spec_accepted_tokens) / spec_draft_tokens : 0.0;
  }
  double AcceptLength() const {
    return spec_verify_steps ? double(spec_emitted_tokens) / spec_verify_steps : 0.0;
  }
};

// Adds `delta` into `sum` op by op.
void Accumulate(const std::vector<runtime::OpCounters>& delta,
                std::vector<runtime::OpCounters>* sum) {
  for (const runtime::OpCounters& d : delta) {
    auto it = std::find_if(sum->begin(), sum->end(), [&](const auto& c) { return c.op == d.op; });
    if (it == sum->end()) {
      sum->push_back(d);
      continue;
    }
    it->launches += d.launches;
    it->device_ns += d.device_ns;
    it->bytes_read += d.bytes_read;
    it->bytes_written += d.bytes_written;
    it->flops += d.flops;
  }
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}
double Stdev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / (v.size() - 1));
}

using Clock = std::chrono::steady_clock;

// The engine tests of a speculating bench: B greedy requests of random P-token prompts (P >= 1),
// N tokens each, run to the end through the engine, first without speculation (each request
// opts out), then with it, each -r times after a warm-up. The prefill and each request's first
// token (which comes with it) are not timed: the clock starts once every request has its first
// token. tokens/s counts the tokens generated after that.
Status MeasureEngine(const BenchOptions& o, const launch::ResolvedLaunch& launch,
                     const model::ModelFile& mf, engine::ModelRunner& runner,
                     std::vector<Record>* records) {
  PC_ASSIGN_OR_RETURN(std::unique_ptr<launch::DraftModel> draft,
                      launch::CreateDraft(launch, mf));
  const model::Tokenizer& tok = *mf.tokenizer;
  engine::Engine eng(
      &runner, launch.engine, [&tok](int32_t t) { return tok.Piece(t, false); }, tok.eog_ids(),
      draft ? draft->runner.get() : nullptr);
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int32_t> random_token(0,
                                                      static_cast<int32_t>(runner.vocab_size() - 1));
  const engine::SpeculativeOptions& so = launch.engine.speculative;
  for (const bool speculative : {false, true}) {
    Record rec{"tg" + std::to_string(o.n_gen) + " engine" +
                   (speculative ? fmt::format("+spec {} k{}", engine::SpecAlgorithmName(so.algorithm),
                                              so.num_draft_tokens)
                                : "") +
                   (o.batch > 1 ? "@" + std::to_string(o.batch) : ""),
               std::max(o.n_prompt, 1), o.n_gen, o.batch, 0, {}, {}};
    rec.speculative = speculative;
    for (int rep = -1; rep < o.reps; ++rep) {  // rep -1 warms up
      std::vector<std::shared_ptr<engine::RequestStream>> streams;
      for (int s = 0; s < o.batch; ++s) {
        engine::GenerateInput in;
        in.rid = "bench-" + std::to_string(s);
        in.prompt.resize(std::max(o.n_prompt, 1));
        for (int32_t& t : in.prompt) t = random_token(rng);
        in.params.temperature = 0;
        in.params.max_tokens = o.n_gen;
        in.params.ignore_eos = true;
        in.params.want_logprob = false;
        in.speculative = speculative;
        PC_ASSIGN_OR_RETURN(auto stream, eng.Submit(std::move(in)));
        streams.push_back(std::move(stream));
      }
      std::vector<int> generated(o.batch, 0);
      int started = 0, finished = 0, timed_tokens = 0;
      Clock::time_point a;
      engine::EngineStats before;
      while (finished < o.batch) {
        eng.Step();
        for (int s = 0; s < o.batch; ++s) {
          for (engine::StreamEvent& ev : streams[s]->Pop(std::chrono::milliseconds(0))) {
            if (!ev.error.ok()) return ev.error;
            const int n = static_cast<int>(ev.tokens.size());
            if (generated[s] == 0 && n > 0) {
              ++started;
              timed_tokens += n - 1;  // the first comes with the prefill
            } else if (started == o.batch) {
              timed_tokens += n;
            }
            generated[s] += n;
            if (ev.finished) ++finished;
          }
        }
        if (started == o.batch && a == Clock::time_point{}) {
          a = Clock::now();
          before = eng.Stats();
        }
      }
      const double s = std::chrono::duration<double>(Clock::now() - a).count();
      const engine::EngineStats after = eng.Stats();
      if (rep < 0) continue;
      rec.ts.push_back(s > 0 ? timed_tokens / s : 0.0);
      rec.ns.push_back(s * 1e9);
      rec.spec_verify_steps += after.spec_verify_steps - before.spec_verify_steps;
      rec.spec_draft_tokens += after.spec_draft_tokens - before.spec_draft_tokens;
      rec.spec_accepted_tokens += after.spec_accepted_tokens - before.spec_accepted_tokens;
      rec.spec_emitted_tokens += after.spec_emitted_tokens - before.spec_emitted_tokens;
    }
    std::fprintf(stderr, "bench: %s %.2f ± %.2f t/s", rec.test.c_str(), Mean(rec.ts),
                 Stdev(rec.ts));
    if (speculative) {
      std::fprintf(stderr, ", acceptance %.3f, %.2f tokens per verification step",
                   rec.AcceptanceRate(), rec.AcceptLength());
    }
    std::fprintf(stderr, "\n");
    records->push_back(std::move(rec));
  }
  return Status::Ok();
}

int Run(const BenchOptions& o, const GlobalOptions& globals) {
  auto spec = BuildSpec(globals, launch::kScopeModel, o.flags, nullptr);
  if (!spec.ok()) return Fail(spec.status());
  const int threads = spec->threads > 0 ? spec->threads : int(std::thread::hardware_concurrency());
  if (o.membw) {
    const double bw = MeasureReadBandwidth(threads, size_t(o.membw_mib) << 20);
    if (o.output == "json") {
      std::printf("[{\"test\": \"membw\", \"n_threads\": %d, \"bytes\": %zu, \"read_gbps\": %.3f}]\n",
                  threads, size_t(o.membw_mib) << 20, bw / 1e9);
    } else {
      std::printf("read bandwidth, %d threads: %.2f GB/s\n", threads, bw / 1e9);
    }
    return 0;
  }
  if (spec->model_path.empty()) return Fail(InvalidArgument("--model-path is required"));
  if (Status s = launch::CheckModelPath(spec->model_path); !s.ok()) return Fail(s);
  if (o.batch < 1 || o.reps < 1 || o.n_prompt < 0 || o.n_gen < 0 || o.depth < 0)
    return Fail(InvalidArgument("--batch, -r must be >= 1; -p, -n, -d >= 0"));
  const auto t0 = Clock::now();
  auto mf = model::OpenModelFile(spec->model_path);
  if (!mf.ok()) return Fail(mf.status());

  // B sequences of depth + n_prompt + n_gen positions, each owning its blocks. The depth is
  // prefilled in chunks of at most kDepthChunk tokens, untimed, before each repetition.
  constexpr int kDepthChunk = 512;
  const int B = o.batch;
  const int64_t bs = spec->page_size;
  spec->context_length = o.depth + o.n_prompt + o.n_gen + 1;
  const int64_t blocks_per_seq = (spec->context_length + bs - 1) / bs;
  spec->max_total_tokens = blocks_per_seq * bs * B;
  spec->max_running_requests = B;
  // A speculative step verifies k + 1 positions of each sequence.
  spec->max_tokens_per_step = std::max<int64_t>(
      {int64_t(o.n_prompt), int64_t(B) * (spec->speculative_num_draft_tokens + 1),
       int64_t(std::min(o.depth, kDepthChunk)), 1});
  spec->tp_size = spec->pp_size = 1;
  auto launch = launch::Resolve(*spec, *mf, nullptr);
  if (!launch.ok()) return Fail(launch.status());
  const bool speculative = launch->engine.speculative.algorithm != engine::SpecAlgorithm::kNone;
  if (speculative && (o.depth > 0 || o.n_gen == 0)) {
    return Fail(InvalidArgument(
        "polychip bench with --speculative-* times generation through the engine: it needs "
        "-n > 0 and no -d"));
  }
  // With --lora: sequence s runs adapter s % (number of adapters).
  model::LoraRegistry loras(mf->config);
  if (Status s = launch::LoadLoras(*spec, loras); !s.ok()) return Fail(s);
  const auto adapters = loras.List();
  if (o.lora_vs_base && (adapters.empty() || o.n_gen == 0 || speculative)) {
    return Fail(InvalidArgument("--lora-vs-base compares decode with and without the adapters: "
                                "it needs --lora, -n > 0 and no --speculative-*"));
  }
  bool with_adapters = true;  // false for --lora-vs-base's base steps
  auto apply_lora = [&](engine::SequenceStep& st, int seq) {
    if (adapters.empty() || !with_adapters) return;
    const auto& a = adapters[size_t(seq) % adapters.size()];
    st.adapter = a.get();
    st.adapter_scale = a->default_scale();
  };
  auto runner = launch::CreateRunner(*launch, *mf, nullptr);
  if (!runner.ok()) return Fail(runner.status());
  model::TransformerRunner& r = static_cast<model::TransformerRunner&>(**runner);
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr,
               "bench: %s on %s, %.1f MiB of weights, %llu bytes of KV cache, loaded in %.2f s\n",
               mf->config.Summary().c_str(), r.device().props().name.c_str(),
               r.weight_bytes() / 1048576.0, static_cast<unsigned long long>(r.kv_bytes()),
               load_s);

  // Sequence s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq).
  std::vector<std::vector<int32_t>> tables(B);
  for (int s = 0; s < B; ++s)
    for (int64_t b = 0; b < blocks_per_seq; ++b)
      tables[s].push_back(static_cast<int32_t>(s * blocks_per_seq + b));
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(r.vocab_size() - 1));
  std::vector<int32_t> prompt(std::max(o.depth + o.n_prompt, 1));
  for (auto& t : prompt) t = tok(rng);
  std::vector<float> logits;

  // Positions [start, start + n) of sequence `seq` in one step.
  auto prefill = [&](int seq, int n, int start) -> Status {
    engine::SequenceStep st;
    st.seq_id = seq;
    st.tokens = {prompt.data() + start, size_t(n)};
    st.start_pos = start;
    st.block_table = tables[seq];
    st.logits = engine::LogitsMode::kLast;
    apply_lora(st, seq);
    return r.Forward({&st, 1}, &logits);
  };
  // Positions [0, n) of every sequence, in chunks: the context a test starts from.
  auto fill = [&](int n) -> Status {
    for (int s = 0; s < B; ++s)
      for (int p = 0; p < n; p += kDepthChunk)
        PC_RETURN_IF_ERROR(prefill(s, std::min(kDepthChunk, n - p), p));
    return Status::Ok();
  };
  // n steps of `seqs` sequences decoding together from position `start`.
  auto decode = [&](int seqs, int start, int n) -> Status {
    std::vector<int32_t> toks(seqs);
    std::vector<engine::SequenceStep> steps(seqs);
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < seqs; ++s) {
        toks[s] = tok(rng);
        steps[s].seq_id = s;
        steps[s].tokens = {&toks[s], 1};
        steps[s].start_pos = start + i;
        steps[s].block_table = tables[s];
        steps[s].logits = engine::LogitsMode::kLast;
        apply_lora(steps[s], s);
      }
      PC_RETURN_IF_ERROR(r.Forward(steps, &logits));
    }
    return Status::Ok();
  };

  std::vector<Record> records;
  const runtime::Device& dev = r.device();
  auto keep = [&](Record rec) {  // a measured test: its line on stderr, its record
    std::fprintf(stderr, "bench: %s %.2f ± %.2f t/s\n", rec.test.c_str(), Mean(rec.ts),
                 Stdev(rec.ts));
    records.push_back(std::move(rec));
  };
  // --lora-vs-base: decode's n steps from `start`, each position run with the adapters and
  // without (the first of the two alternating), timed apart into the two records.
  auto measure_vs_base = [&](Record rec, const std::function<Status()>& setup, int seqs,
                             int start, int n) -> Status {
    Record base = rec;
    base.test += " base";
    for (int rep = -1; rep < o.reps; ++rep) {  // rep -1 warms up
      PC_RETURN_IF_ERROR(setup());
      double seconds[2] = {0, 0};  // with the adapters, without
      for (int i = 0; i < n; ++i) {
        for (int k = 0; k < 2; ++k) {
          const int which = (i + k) % 2;
          with_adapters = which == 0;
          const auto a = Clock::now();
          const Status st = decode(seqs, start + i, 1);
          seconds[which] += std::chrono::duration<double>(Clock::now() - a).count();
          with_adapters = true;
          PC_RETURN_IF_ERROR(st);
        }
      }
      if (rep < 0) continue;
      for (int which = 0; which < 2; ++which) {
        Record& into = which == 0 ? rec : base;
        into.ts.push_back(n * seqs / seconds[which]);
        into.ns.push_back(seconds[which] * 1e9);
      }
    }
    keep(std::move(rec));
    keep(std::move(base));
    return Status::Ok();
  };
  // `steps`: forward steps one body() runs (for the per-op records per step).
  auto measure = [&](Record rec, const std::function<Status()>& setup,
                     const std::function<Status()>& body, int tokens, int steps) -> Status {
    for (int rep = -1; rep < o.reps; ++rep) {  // rep -1 warms up
      PC_RETURN_IF_ERROR(setup());
      const auto before = dev.backend()->ReadOpCounters(dev);
      const auto a = Clock::now();
      PC_RETURN_IF_ERROR(body());
      const double s = std::chrono::duration<double>(Clock::now() - a).count();
      const auto after = dev.backend()->ReadOpCounters(dev);
      if (rep >= 0) {
        rec.ts.push_back(tokens / s);
        rec.ns.push_back(s * 1e9);
        if (before && after) {
          if (!rec.ops) rec.ops.emplace();
          Accumulate(runtime::OpCountersDelta(*before, *after), &*rec.ops);
          rec.op_steps += steps;
        }
      }
    }
    keep(std::move(rec));
    return Status::Ok();
  };
  const int d = o.depth;
  auto at_depth = [&] { return fill(d); };
  const std::string suffix = d > 0 ? " @ d" + std::to_string(d) : "";
  if (B == 1) {
    if (o.n_prompt > 0) {
      Record rec{"pp" + std::to_string(o.n_prompt) + suffix, o.n_prompt, 0, 1, d, {}, {}};
      if (Status s =
              measure(rec, at_depth, [&] { return prefill(0, o.n_prompt, d); }, o.n_prompt, 1);
          !s.ok())
        return Fail(s);
    }
    if (o.n_gen > 0) {
      Record rec{"tg" + std::to_string(o.n_gen) + suffix, 0, o.n_gen, 1, d, {}, {}};
      if (Status s = o.lora_vs_base
                         ? measure_vs_base(rec, at_depth, 1, d, o.n_gen)
                         : measure(rec, at_depth, [&] { return decode(1, d, o.n_gen); },
                                   o.n_gen, o.n_gen);
          !s.ok())
        return Fail(s);
    }
  } else {
    Record rec{"pp" + std::to_string(o.n_prompt) + "+tg" + std::to_string(o.n_gen) + "@" +
                   std::to_string(B) + suffix,
               o.n_prompt, o.n_gen, B, d, {}, {}};
    auto setup = [&]() -> Status { return fill(d + o.n_prompt); };
    if (Status s = o.lora_vs_base
                       ? measure_vs_base(rec, setup, B, d + o.n_prompt, o.n_gen)
                       : measure(rec, setup, [&] { return decode(B, d + o.n_prompt, o.n_gen); },
                                 o.n_gen * B, o.n_gen);
        !s.ok())
      return Fail(s);
  }

  if (speculative) {
    if (Status s = MeasureEngine(o, *launch, *mf, r, &records); !s.ok()) return Fail(s);
  }

  // The file's scheme by name (a mixture such as Q4_K_M) where it names one we write, else
  // one tensor's type.
  std::string type = model::LlamaFileTypeName(
      mf->file->GetU32("general.file_type", std::numeric_limits<uint32_t>::max()));
  if (type.empty()) {
    type = "?";
    if (const model::GgufTensor* t = mf->file->FindTensor("blk.0.ffn_down.weight"))
      type = DTypeName(t->dtype);
    if (const model::GgufTensor* t = mf->file->FindTensor("blk.0.attn_q.weight"))
      type = DTypeName(t->dtype);
  }
  // Bytes a decode step reads from the model file: every tensor but the embedding table (one
  // row is gathered), unless the table doubles as the output projection.
  // Of a mixture of experts' expert tensors, a token reads the share it runs (expert_used_count
  // of expert_count).
  uint64_t bytes_per_token = 0;
  const model::ModelConfig& mc = mf->config;
  for (const model::GgufTensor& t : mf->file->tensors()) {
    if (t.name == "token_embd.weight" && !mc.tied_output) continue;
    const bool experts = mc.n_expert > 0 && t.name.find("_exps.weight") != std::string::npos;
    bytes_per_token += experts ? t.n_bytes / mc.n_expert * mc.n_expert_used : t.n_bytes;
  }
  const std::string model_type = std::string(model::ArchName(mf->config.arch)) + " " + type;
  if (o.output == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const Record& rec : records) {
      out.push_back({{"model_filename", spec->model_path},
                     {"model_type", model_type},
                     {"model_size", r.weight_bytes()},
                     {"bytes_per_token", bytes_per_token},
                     {"backends", r.device().props().name},
                     {"n_threads", threads},
                     {"n_prompt", rec.n_prompt},
                     {"n_gen", rec.n_gen},
                     {"n_seqs", rec.n_seqs},
                     {"n_depth", rec.n_depth},
                     {"test", rec.test},
                     {"type_k", model::KvCacheDtypeName(launch::KvCacheDtypesOf(*spec).k)},
                     {"type_v", model::KvCacheDtypeName(launch::KvCacheDtypesOf(*spec).v)},
                     {"load_s", load_s},
                     {"avg_ns", Mean(rec.ns)},
                     {"stddev_ns", Stdev(rec.ns)},
                     {"avg_ts", Mean(rec.ts)},
                     {"stddev_ts", Stdev(rec.ts)},
                     {"samples_ts", rec.ts}});
      if (rec.speculative) {
        out.back()["spec_verify_steps"] = rec.spec_verify_steps;
        out.back()["spec_draft_tokens"] = rec.spec_draft_tokens;
        out.back()["spec_accepted_tokens"] = rec.spec_accepted_tokens;
        out.back()["spec_acceptance_rate"] = rec.AcceptanceRate();
        out.back()["spec_accept_length"] = rec.AcceptLength();
      }
      // Per forward step, averaged over the repetitions; null without per-op counters.
      out.back()["ops_per_step"] =
          rec.ops ? OpRecordsJson(*rec.ops, rec.op_steps) : nlohmann::json();
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("| model | size | backend | threads | test | t/s |\n");
    std::printf("| --- | ---: | --- | ---: | ---: | ---: |\n");
    for (const Record& rec : records) {
      std::printf("| %s | %.2f MiB | %s | %d | %s | %.2f ± %.2f |\n", model_type.c_str(),
                  r.weight_bytes() / 1048576.0, r.device().props().name.c_str(), threads,
                  rec.test.c_str(), Mean(rec.ts), Stdev(rec.ts));
    }
    for (const Record& rec : records) {
      if (!rec.speculative) continue;
      std::printf("\n%s: %lld verification steps, %lld draft tokens, %lld accepted (acceptance "
                  "%.3f) | %.2f tokens per verification step\n",
                  rec.test.c_str(), static_cast<long long>(rec.spec_verify_steps),
                  static_cast<long long>(rec.spec_draft_tokens),
                  static_cast<long long>(rec.spec_accepted_tokens), rec.AcceptanceRate(),
                  rec.AcceptLength());
    }
  }
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& globals) {
  auto o = std::make_shared<BenchOptions>();
  AddLaunchOptions(app, launch::kScopeModel, &o->flags);
  app.add_option("-p,--n-prompt", o->n_prompt, "prompt tokens (default 128; 0 skips pp)");
  app.add_option("-n,--n-gen", o->n_gen, "generated tokens (default 64; 0 skips tg)");
  app.add_option("-d,--n-depth", o->depth,
                 "tokens already in the KV cache before each test (default 0), as llama-bench's -d");
  app.add_option("-r,--repetitions", o->reps, "timed repetitions after a warm-up (default 3)");
  app.add_option("--batch", o->batch, "sequences decoding together (default 1)");
  app.add_option("-o,--output", o->output, "md (default) or json")
      ->check(CLI::IsMember({"md", "json"}));
  app.add_flag("--lora-vs-base", o->lora_vs_base,
               "with --lora: run each decode position also without the adapters, alternating, "
               "and report that as the test's ' base' row (the adapters' cost from one process)");
  app.add_flag("--membw", o->membw, "measure the host's read bandwidth instead");
  app.add_option("--membw-mib", o->membw_mib, "buffer size for --membw (default 1024)");
  return [o, &globals] { return Run(*o, globals); };
}

const bool kRegistered =
    RegisterCommand({"bench", "prompt/generation throughput, like llama-bench", Setup});

}  // namespace
}  // namespace polychip::cli
