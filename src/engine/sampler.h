// Token sampling and stop conditions, for one sequence.
//
// Sampler turns a row of logits into a token. The order of the transformations is fixed and
// documented because it changes results:
//   1. penalties (then logit_bias): repetition (over prompt + generated tokens), frequency and presence (over
//      generated tokens only, as the OpenAI API defines them), within the last
//      `penalty_last_n` tokens;
//   2. min_tokens: stop tokens are masked until min_tokens tokens were generated;
//   3. temperature <= 0: greedy (argmax; ties go to the lowest token id), done;
//   4. logits / temperature, then top-k, top-p (nucleus), min-p filters;
//   5. a draw from the remaining distribution with the sequence's own RNG (seeded: the same
//      seed and the same logits give the same tokens).
// A grammar (structured outputs) masks every token it does not allow after step 2, so it
// combines with every sampler above; when min_tokens and a finished grammar leave nothing, the
// grammar wins.
// Logprobs are those of the model's distribution (log-softmax of the raw logits, before
// penalties and temperature), as OpenAI-compatible servers report them.
//
// StopChecker decides when a sequence is finished and which text may be streamed: it holds back
// the tail of the text that could still become a stop string (so a stop string is matched
// across token boundaries and never emitted) and any incomplete UTF-8 sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"

namespace polychip::engine {

struct SamplingParams {
  float temperature = 0.f;  // <= 0: greedy
  int32_t top_k = 0;        // <= 0: off
  float top_p = 1.f;        // >= 1: off
  float min_p = 0.f;        // <= 0: off
  float repetition_penalty = 1.f;  // 1: off; > 1 discourages repeats
  float frequency_penalty = 0.f;   // subtracted once per occurrence
  float presence_penalty = 0.f;    // subtracted once if present
  int32_t penalty_last_n = 64;     // window of tokens the penalties look at; < 0: all
  std::optional<uint64_t> seed;    // absent: a random seed
  int32_t top_logprobs = 0;        // number of alternatives to report (0: none)
  // Compute the chosen token's logprob (a log-sum-exp over the vocabulary, a large share of
  // a small model's step); off: SampleResult::logprob is 0.
  bool want_logprob = true;

  int32_t max_tokens = 256;
  int32_t min_tokens = 0;  // stop tokens and stop strings are ignored before this many tokens
  bool ignore_eos = false;              // do not stop at the vocabulary's end-of-generation tokens
  std::vector<std::string> stop;        // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;  // extra stop tokens
  // Added to the logits of these tokens after the penalties (OpenAI's logit_bias; -100 bans).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Constrained decoding (JSON Schema, regex, EBNF compiled by grammar::GrammarCache): null is
  // unconstrained. Shared by every sequence with the same constraint; each has its own Matcher.
  std::shared_ptr<grammar::CompiledGrammar> grammar;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.f;                    // of the chosen token
  std::vector<TokenLogprob> top_logprobs;  // best first, params.top_logprobs entries
};

class Sampler {
 public:
  // `prompt` seeds the repetition-penalty history. `stop_tokens` are the vocabulary's
  // end-of-generation tokens (masked while n_generated < min_tokens unless ignore_eos).
  Sampler(SamplingParams params, int64_t vocab_size, std::vector<int32_t> eog_tokens,
          std::span<const int32_t> prompt = {});

  // Samples one token from `logits` (vocab_size floats) and records it as generated.
  SampleResult Sample(std::span<const float> logits);

  // Records a token generated elsewhere (e.g. forced), for the penalties.
  void Accept(int32_t token);

  // Speculative decoding's verification of one draft token (rejection sampling, Leviathan et
  // al. 2023 / Chen et al. 2023). `logits` is the target's row at the position `draft` was
  // proposed for; the draft drew it from `q` (vocab floats summing to 1; empty: q is one-hot at
  // `draft`, as for greedy drafts and n-gram lookup). With p the distribution Sample would draw
  // from here, the draft is kept with probability min(1, p(draft) / q(draft)); otherwise a token
  // is drawn from max(0, p - q), renormalised. The emitted token is so distributed exactly as
  // p, and under greedy decoding it is Sample's token. It is recorded as generated (penalties,
  // grammar) like Sample's; *accepted tells whether it is the draft.
  SampleResult SampleDraft(std::span<const float> logits, int32_t draft, std::span<const float> q,
                           bool* accepted);
  // The distribution Sample draws from at `logits` (every step above; greedy: one-hot at its
  // token), as vocab floats summing to 1. Leaves the sampler's state as it was.
  void Distribution(std::span<const float> logits, std::vector<float>* probs);
  // A draw from `probs` (vocab floats, summing to 1) with the sampler's generator; nothing is
  // recorded as generated.
  int32_t Draw(std::span<const float> probs);

  int32_t n_generated() const { return n_generated_; }
  const SamplingParams& params() const { return params_; }
  // The grammar's position (null when unconstrained).
  grammar::Matcher* matcher() { return matcher_ ? &*matcher_ : nullptr; }
  uint64_t seed() const { return seed_; }

 private:
  void ApplyPenalties(std::vector<float>& logits) const;
  // A copy of `raw` through steps 1-2 and the grammar's mask.
  std::vector<float> Processed(std::span<const float> raw);
  double NextUniform();  // [0, 1)
  // The candidates softmax(logits / temperature) keeps after top-k, top-p and min-p:
  // idx[0, n) with unnormalised probabilities prob[idx[i]] (empty when every logit is -inf).
  void Candidates(const std::vector<float>& logits, std::vector<int32_t>* idx,
                  std::vector<float>* prob, size_t* n) const;
  // Draws from softmax(logits / temperature) restricted by top-k, top-p and min-p.
  int32_t SampleTemperature(std::vector<float>& logits);
  // What Sample and SampleDraft do once the token is chosen: the grammar and the history
  // advance, the logprobs (of `raw`) are filled in.
  SampleResult Emit(std::span<const float> raw, int32_t token);

  SamplingParams params_;
  int64_t vocab_size_;
  std::vector<int32_t> masked_until_min_;  // stop tokens masked before min_tokens
  std::vector<int32_t> history_;           // prompt + generated, for repetition
  size_t n_prompt_ = 0;
  int32_t n_generated_ = 0;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::optional<grammar::Matcher> matcher_;
};

// Greedy argmax (lowest id wins ties). Exposed for tools that need no Sampler.
int32_t ArgMax(std::span<const float> logits);

// Log-softmax value of one entry, in double precision (perplexity uses it).
double LogSoftmaxAt(std::span<const float> logits, int32_t token);

enum class FinishReason { kNone, kStop, kLength };
const char* FinishReasonName(FinishReason reason);  // "", "stop", "length"

class StopChecker {
 public:
  StopChecker(const SamplingParams& params, std::vector<int32_t> eog_tokens);

  struct Step {
    std::string text;  // text that can be emitted now (valid UTF-8)
    FinishReason finish = FinishReason::kNone;
    std::string stop_matched;  // the stop string or "" (a stop token)
    int32_t stop_token = -1;   // the stop token that ended the sequence, or -1
  };
  // Feeds the n-th generated token (1-based count after it) and its detokenized bytes.
  Step Push(int32_t token, std::string_view piece);
  // Ends the sequence for another reason (max_tokens, context full): returns what was held back
  // (incomplete UTF-8 replaced by U+FFFD).
  std::string Flush();

  bool finished() const { return finished_; }
  int32_t n_generated() const { return n_generated_; }

 private:
  // How many bytes at the end of pending_ must be held back.
  size_t HoldBack() const;

  std::vector<std::string> stop_;
  std::vector<int32_t> stop_tokens_;
  int32_t min_tokens_;
  int32_t max_tokens_;
  std::string pending_;  // detokenized, not yet emitted
  int32_t n_generated_ = 0;
  bool finished_ = false;
};

// Returns the valid UTF-8 prefix of `text` that does not end inside a multi-byte sequence;
// invalid bytes before it are replaced by U+FFFD. *consumed receives how many input bytes the
// result covers (the rest is an incomplete sequence to keep).
std::string TakeCompleteUtf8(std::string_view text, size_t* consumed);

}  // namespace polychip::engine
