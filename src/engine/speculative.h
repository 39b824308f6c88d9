// Speculative decoding's proposers: what guesses the next tokens of a decoding sequence, so that
// the target model verifies several positions in one step (Leviathan et al. 2023, "Fast
// Inference from Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating Large
// Language Model Decoding with Speculative Sampling").
//
// The engine asks a Proposer for up to k draft tokens per sequence, runs the target over
// [last token, draft...] (k + 1 positions, logits at each) inside its batched step, and keeps
// the drafts Sampler::SampleDraft accepts plus one token of the target's own. The target's KV of
// rejected positions is simply not counted (Sequence::num_computed), and is overwritten later.
//
// Two proposers:
//   draft model  a smaller model of the same vocabulary (any architecture, any device) behind
//                the ModelRunner seam, with its KV in a pool of its own (its own BlockManager,
//                no prefix cache). It remembers, per sequence, which tokens its KV holds; a
//                proposal first re-feeds what changed since (the target's token, the positions
//                after a rejection: the rollback is a shorter count), then runs k single-token
//                steps batched over every proposing sequence. Greedy requests draft greedily (q
//                one-hot); sampled ones draw from the draft's distribution under the request's
//                temperature, top-k, top-p and min-p, which goes to the verification as q.
//   n-gram       prompt lookup: the latest earlier occurrence of the sequence's last n tokens
//                (n from max down to min) in its own prompt and output, and the tokens that
//                followed it. No model, q one-hot.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "util/status.h"

namespace polychip::engine {

enum class SpecAlgorithm { kNone, kDraft, kNgram };
// "none", "draft" (a draft model), "ngram".
StatusOr<SpecAlgorithm> ParseSpecAlgorithm(const std::string& name);
const char* SpecAlgorithmName(SpecAlgorithm a);

struct SpeculativeOptions {
  SpecAlgorithm algorithm = SpecAlgorithm::kNone;
  int32_t num_draft_tokens = 4;  // k at most, per sequence and step
  // Each sequence's k follows its acceptance: one more after a step that kept every draft,
  // one less after a step that kept none (between 1 and num_draft_tokens).
  bool adaptive = true;
  // A step with more decoding sequences than this runs without speculation: the batch already
  // keeps the device's arithmetic busy, so verifying rejected guesses would cost throughput.
  int32_t disable_batch_size = 4;
  int32_t ngram_min = 1;  // n-gram lookup: the shortest suffix matched
  int32_t ngram_max = 3;  //               and the longest (tried first)
  // The draft model has the model's matrices (its architecture and shapes: the model itself or
  // a quantized copy), so a request's LoRA adapter applies to its proposals too. Otherwise the
  // draft proposes from its own weights; either way the model verifies with the adapter, so
  // the output is exact and only the acceptance differs.
  bool draft_takes_adapters = false;
};

// One sequence's share of a proposal.
struct DraftRequest {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;  // prompt + generated; the last one is not in the target's KV
  int32_t k = 0;                    // draft tokens wanted
  const SamplingParams* params = nullptr;  // the request's: greedy or the draw's shape
  uint64_t seed = 0;                       // the request's sampler seed (the draft's draws)
  // The LoRA adapter the draft model applies (SpeculativeOptions::draft_takes_adapters); null:
  // its own weights.
  const Adapter* adapter = nullptr;
  float adapter_scale = 1;
  // Filled by the proposer: at most k tokens (none: this sequence decodes plainly), and, for
  // drafts drawn at random, the distribution each was drawn from (draft.size() rows of the
  // target's vocabulary); empty when every draft was deterministic (q one-hot).
  std::vector<int32_t> draft;
  std::vector<float> q;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Fills every request's draft (and q). A proposer that cannot serve a sequence this step
  // (its draft pool is full) leaves that draft empty.
  virtual Status Propose(std::span<DraftRequest* const> requests) = 0;
  // The sequence finished or was preempted: whatever the proposer keeps for it goes.
  virtual void Release(int64_t seq_id) {}
  // Everything goes (the target's KV was dropped: a plugin hot reload).
  virtual void ReleaseAll() {}
};

// Prompt lookup over the sequence's own tokens.
std::unique_ptr<Proposer> MakeNgramProposer(int32_t ngram_min, int32_t ngram_max);

// A draft model behind `draft` (which must outlive the proposer), proposing tokens of a target
// vocabulary of `target_vocab` entries (the draft's logits beyond it are ignored; a smaller
// draft vocabulary never proposes the target's extra tokens).
std::unique_ptr<Proposer> MakeDraftModelProposer(ModelRunner* draft, int64_t target_vocab);

}  // namespace polychip::engine
