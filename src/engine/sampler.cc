#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace polychip::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The largest value (NaNs ignored), in 16 independent lanes so that the compiler vectorizes
// it: a serial scan of a 150k vocabulary per token was a visible share of a decode step.
float MaxValue(std::span<const float> x) {
  constexpr size_t kLanes = 16;
  float lanes[kLanes];
  std::fill(std::begin(lanes), std::end(lanes), kNegInf);
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float m = kNegInf;
  for (; i < x.size(); ++i) m = x[i] > m ? x[i] : m;
  for (float v : lanes) m = v > m ? v : m;
  return m;
}

// log(sum(exp(x))) in double, stable (only computed when logprobs are asked for).
double LogSumExp(std::span<const float> x) {
  const float max_v = MaxValue(x);
  if (max_v == kNegInf) return kNegInf;
  double sum = 0;
  for (float v : x) sum += std::exp(double(v) - max_v);
  return max_v + std::log(sum);
}

}  // namespace

int32_t ArgMax(std::span<const float> logits) {
  // The first index holding the maximum (the lowest id wins ties).
  const float m = MaxValue(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == m) return static_cast<int32_t>(i);
  }
  return 0;
}

double LogSoftmaxAt(std::span<const float> logits, int32_t token) {
  return double(logits[token]) - LogSumExp(logits);
}

Sampler::Sampler(SamplingParams params, int64_t vocab_size, std::vector<int32_t> eog_tokens,
                 std::span<const int32_t> prompt)
    : params_(std::move(params)), vocab_size_(vocab_size), history_(prompt.begin(), prompt.end()),
      n_prompt_(prompt.size()) {
  if (!params_.ignore_eos) masked_until_min_ = std::move(eog_tokens);
  for (int32_t t : params_.stop_token_ids) masked_until_min_.push_back(t);
  seed_ = params_.seed ? *params_.seed : std::random_device{}();
  rng_.seed(seed_);
  if (params_.grammar) matcher_.emplace(params_.grammar);
}

void Sampler::Accept(int32_t token) {
  history_.push_back(token);
  ++n_generated_;
}

double Sampler::NextUniform() {
  // 53 random bits: the same on every standard library (std::uniform_real_distribution is not).
  return double(rng_() >> 11) * (1.0 / 9007199254740992.0);
}

void Sampler::ApplyPenalties(std::vector<float>& logits) const {
  for (const auto& [token, bias] : params_.logit_bias) {
    if (token >= 0 && token < vocab_size_) logits[token] += bias;
  }
  const bool repetition = params_.repetition_penalty != 1.f;
  const bool freq_presence = params_.frequency_penalty != 0.f || params_.presence_penalty != 0.f;
  if (!repetition && !freq_presence) return;
  size_t begin = 0;
  if (params_.penalty_last_n >= 0 && history_.size() > size_t(params_.penalty_last_n)) {
    begin = history_.size() - params_.penalty_last_n;
  }
  // token -> {seen anywhere in the window, occurrences among generated tokens}
  std::unordered_map<int32_t, std::pair<bool, int32_t>> counts;
  for (size_t i = begin; i < history_.size(); ++i) {
    auto& c = counts[history_[i]];
    c.first = true;
    if (i >= n_prompt_) ++c.second;
  }
  for (const auto& [token, c] : counts) {
    if (token < 0 || token >= vocab_size_) continue;
    float& l = logits[token];
    if (repetition) l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    if (c.second > 0) {
      l -= c.second * params_.frequency_penalty + params_.presence_penalty;
    }
  }
}

// Sorting the whole vocabulary (150k entries) for every token cost ~100 ms per token on a
// loaded CPU, so candidates are only ordered as far as top-k / top-p need: top-k selects with
// nth_element, top-p sorts a growing head of the list until it holds the nucleus, and without
// either the draw walks the candidates in id order (the distribution is the same).
void Sampler::Candidates(const std::vector<float>& logits, std::vector<int32_t>* idx_out,
                         std::vector<float>* prob_out, size_t* n_out) const {
  std::vector<int32_t>& idx = *idx_out;
  std::vector<float>& prob = *prob_out;
  const float inv_t = 1.f / params_.temperature;
  const float max_l = MaxValue(logits);
  idx.clear();
  idx.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kNegInf) idx.push_back(static_cast<int32_t>(i));
  }
  *n_out = 0;
  if (idx.empty()) return;
  // Unnormalised probabilities relative to the best candidate (which gets 1).
  prob.assign(logits.size(), 0.f);
  for (int32_t i : idx) prob[i] = std::exp((logits[i] - max_l) * inv_t);
  auto better = [&](int32_t a, int32_t b) {
    return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
  };
  size_t n = idx.size();
  size_t sorted = 0;  // idx[0, sorted) is in descending order
  if (params_.top_k > 0 && size_t(params_.top_k) < n) {
    n = params_.top_k;
    std::nth_element(idx.begin(), idx.begin() + n - 1, idx.end(), better);
    idx.resize(n);
  }
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[idx[i]];
  if (params_.top_p < 1.f) {
    const double target = params_.top_p * sum;
    for (size_t head = std::min<size_t>(n, 64);; head = std::min(n, head * 4)) {
      std::partial_sort(idx.begin() + sorted, idx.begin() + head, idx.begin() + n, better);
      sorted = head;
      double cum = 0;
      size_t keep = 0;
      while (keep < head && cum < target) cum += prob[idx[keep++]];
      if (cum >= target || head == n) {
        n = keep;
        break;
      }
    }
  }
  if (params_.min_p > 0.f) {
    // The best candidate has probability 1 here; keep those within min_p of it.
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      if (prob[idx[i]] >= params_.min_p) idx[kept++] = idx[i];
    }
    n = std::max<size_t>(kept, 1);
  }
  *n_out = n;
}

int32_t Sampler::SampleTemperature(std::vector<float>& logits) {
  std::vector<int32_t> idx;
  std::vector<float> prob;
  size_t n = 0;
  Candidates(logits, &idx, &prob, &n);
  if (n == 0) return ArgMax(logits);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[idx[i]];
  const double u = NextUniform() * total;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob[idx[i]];
    if (u < cum) return idx[i];
  }
  return idx[n - 1];
}

std::vector<float> Sampler::Processed(std::span<const float> raw) {
  std::vector<float> logits(raw.begin(), raw.end());
  ApplyPenalties(logits);
  if (n_generated_ < params_.min_tokens) {
    for (int32_t t : masked_until_min_) {
      if (t >= 0 && t < vocab_size_) logits[t] = kNegInf;
    }
  }
  if (matcher_) {
    matcher_->ApplyMask(logits);
    if (MaxValue(logits) == kNegInf && n_generated_ < params_.min_tokens) {
      // The grammar allows only the end, which min_tokens masked: the grammar wins.
      logits.assign(raw.begin(), raw.end());
      ApplyPenalties(logits);
      matcher_->ApplyMask(logits);
    }
  }
  return logits;
}

SampleResult Sampler::Sample(std::span<const float> raw) {
  const bool plain_greedy = !matcher_ && params_.logit_bias.empty() &&
                            params_.temperature <= 0.f && params_.repetition_penalty == 1.f &&
                            params_.frequency_penalty == 0.f && params_.presence_penalty == 0.f &&
                            (n_generated_ >= params_.min_tokens || masked_until_min_.empty());
  // Greedy under a grammar alone: the best allowed token read through the mask, without the
  // copy, the -inf writes and the second scan of a masked row (a third of a millisecond per
  // token at a 152k vocabulary, x16 requests per step).
  const bool masked_greedy = matcher_ && params_.logit_bias.empty() &&
                             params_.temperature <= 0.f && params_.repetition_penalty == 1.f &&
                             params_.frequency_penalty == 0.f && params_.presence_penalty == 0.f &&
                             (n_generated_ >= params_.min_tokens || masked_until_min_.empty());
  int32_t fast = -1;
  if (masked_greedy) fast = matcher_->ArgMaxAllowed(raw);
  int32_t token = 0;
  if (plain_greedy) {
    token = ArgMax(raw);  // nothing modifies the logits: no copy
  } else if (fast >= 0 && raw[fast] != kNegInf) {
    token = fast;
  } else {
    std::vector<float> logits = Processed(raw);
    token = params_.temperature <= 0.f ? ArgMax(logits) : SampleTemperature(logits);
  }
  return Emit(raw, token);
}

SampleResult Sampler::Emit(std::span<const float> raw, int32_t token) {
  SampleResult result;
  result.token = token;
  if (matcher_) matcher_->Accept(token);
  const bool need_lse = params_.want_logprob || params_.top_logprobs > 0;
  const double lse = need_lse ? LogSumExp(raw) : 0.0;
  if (need_lse) result.logprob = static_cast<float>(double(raw[token]) - lse);
  if (params_.top_logprobs > 0) {
    const size_t k = std::min<size_t>(params_.top_logprobs, raw.size());
    std::vector<int32_t> idx(raw.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
    });
    for (size_t i = 0; i < k; ++i) {
      result.top_logprobs.push_back({idx[i], static_cast<float>(double(raw[idx[i]]) - lse)});
    }
  }
  Accept(token);
  return result;
}

void Sampler::Distribution(std::span<const float> raw, std::vector<float>* probs) {
  probs->assign(raw.size(), 0.f);
  std::vector<float> logits = Processed(raw);
  if (params_.temperature <= 0.f) {
    (*probs)[ArgMax(logits)] = 1.f;
    return;
  }
  std::vector<int32_t> idx;
  std::vector<float> prob;
  size_t n = 0;
  Candidates(logits, &idx, &prob, &n);
  if (n == 0) {
    (*probs)[ArgMax(logits)] = 1.f;
    return;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[idx[i]];
  for (size_t i = 0; i < n; ++i) (*probs)[idx[i]] = static_cast<float>(prob[idx[i]] / total);
}

int32_t Sampler::Draw(std::span<const float> probs) {
  double total = 0;
  for (float v : probs) total += v;
  const double u = NextUniform() * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.f) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;
}

SampleResult Sampler::SampleDraft(std::span<const float> raw, int32_t draft,
                                  std::span<const float> q, bool* accepted) {
  if (params_.temperature <= 0.f) {
    // p is one-hot at Sample's token: the draft is kept exactly when it is that token.
    SampleResult r = Sample(raw);
    *accepted = r.token == draft;
    return r;
  }
  std::vector<float> p;
  Distribution(raw, &p);
  const double q_draft = q.empty() ? 1.0 : double(q[draft]);
  const double p_draft = p[draft];
  if (q_draft > 0 && NextUniform() * q_draft < p_draft) {
    *accepted = true;
    return Emit(raw, draft);
  }
  *accepted = false;
  // Rejected: the residual max(0, p - q). It is empty only when p == q (then p(draft) >=
  // q(draft) and the draft was kept), or by rounding: p itself then.
  std::vector<float> residual(p.size(), 0.f);
  double mass = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float qi = q.empty() ? (static_cast<int32_t>(i) == draft ? 1.f : 0.f) : q[i];
    const float d = p[i] - qi;
    if (d > 0.f) {
      residual[i] = d;
      mass += d;
    }
  }
  return Emit(raw, Draw(mass > 0 ? std::span<const float>(residual) : std::span<const float>(p)));
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    default:
      return "";
  }
}

// ---- UTF-8 --------------------------------------------------------------------------------

namespace {

// Length of the sequence a lead byte starts (0: not a lead byte).
int Utf8SeqLen(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool IsCont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Validity of the second byte given the lead (excludes overlongs and surrogates).
bool SecondOk(unsigned char lead, unsigned char c) {
  if (!IsCont(c)) return false;
  if (lead == 0xE0) return c >= 0xA0;
  if (lead == 0xED) return c <= 0x9F;
  if (lead == 0xF0) return c >= 0x90;
  if (lead == 0xF4) return c <= 0x8F;
  return true;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

std::string TakeCompleteUtf8(std::string_view text, size_t* consumed) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const int len = Utf8SeqLen(lead);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Check the bytes that are present.
    int have = 1;
    bool bad = false;
    while (have < len && i + have < text.size()) {
      const auto c = static_cast<unsigned char>(text[i + have]);
      if (have == 1 ? !SecondOk(lead, c) : !IsCont(c)) {
        bad = true;
        break;
      }
      ++have;
    }
    if (bad) {
      out += kReplacement;
      i += have;  // the valid prefix of a broken sequence is one replacement
      continue;
    }
    if (have < len) break;  // incomplete at the end: keep for the next piece
    out.append(text.substr(i, len));
    i += len;
  }
  *consumed = i;
  return out;
}

// ---- StopChecker --------------------------------------------------------------------------

StopChecker::StopChecker(const SamplingParams& params, std::vector<int32_t> eog_tokens)
    : min_tokens_(params.min_tokens), max_tokens_(params.max_tokens) {
  for (const auto& s : params.stop) {
    if (!s.empty()) stop_.push_back(s);
  }
  if (!params.ignore_eos) stop_tokens_ = std::move(eog_tokens);
  for (int32_t t : params.stop_token_ids) stop_tokens_.push_back(t);
}

size_t StopChecker::HoldBack() const {
  // The longest suffix of pending_ that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stop_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

StopChecker::Step StopChecker::Push(int32_t token, std::string_view piece) {
  Step step;
  if (finished_) {
    step.finish = FinishReason::kStop;
    return step;
  }
  ++n_generated_;
  const bool may_stop = n_generated_ > min_tokens_;
  if (may_stop && std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) {
    step.text = Flush();
    step.finish = FinishReason::kStop;
    step.stop_token = token;
    finished_ = true;
    return step;
  }
  // Only text from just before the new piece can complete a stop string.
  const size_t old_size = pending_.size();
  pending_.append(piece);
  if (may_stop) {
    size_t best = std::string::npos;
    for (const auto& s : stop_) {
      const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
      const size_t pos = pending_.find(s, from);
      if (pos != std::string::npos && pos < best) {
        best = pos;
        step.stop_matched = s;
      }
    }
    if (best != std::string::npos) {
      pending_.resize(best);
      step.text = Flush();
      step.finish = FinishReason::kStop;
      finished_ = true;
      return step;
    }
  }
  if (max_tokens_ > 0 && n_generated_ >= max_tokens_) {
    step.text = Flush();
    step.finish = FinishReason::kLength;
    finished_ = true;
    return step;
  }
  const size_t emit_limit = pending_.size() - (may_stop ? HoldBack() : 0);
  size_t consumed = 0;
  step.text = TakeCompleteUtf8(std::string_view(pending_).substr(0, emit_limit), &consumed);
  pending_.erase(0, consumed);
  return step;
}

std::string StopChecker::Flush() {
  size_t consumed = 0;
  std::string out = TakeCompleteUtf8(pending_, &consumed);
  if (consumed < pending_.size()) out += kReplacement;  // an incomplete sequence at the end
  pending_.clear();
  return out;
}

}  // namespace polychip::engine
