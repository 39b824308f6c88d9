#include "dist/step_protocol.h"

#include <cstring>

namespace polychip::dist {

using engine::SequenceStep;

namespace {

void PushId(std::vector<int32_t>& p, int64_t id) {
  p.push_back(int32_t(uint64_t(id) & 0xffffffffu));
  p.push_back(int32_t(uint64_t(id) >> 32));
}
int64_t ReadId(const int32_t* w) {
  return int64_t(uint64_t(uint32_t(w[0])) | (uint64_t(uint32_t(w[1])) << 32));
}
int32_t FloatBits(float f) {
  int32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}
float BitsFloat(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
size_t Words(size_t bytes) { return (bytes + 3) / 4; }
void PushBytes(std::vector<int32_t>& p, const std::string& s) {
  const size_t at = p.size();
  p.resize(at + Words(s.size()), 0);
  std::memcpy(p.data() + at, s.data(), s.size());
}

}  // namespace

std::vector<int32_t> EncodeStep(std::span<const SequenceStep> batch,
                                std::span<const StepAdapter> adapters,
                                std::span<const int64_t> forget) {
  std::vector<int32_t> p;
  p.push_back(int32_t(adapters.size()));
  for (const StepAdapter& a : adapters) {
    PushId(p, a.id);
    p.push_back(a.fresh ? 1 : 0);
    p.push_back(FloatBits(a.default_scale));
    p.push_back(int32_t(a.name.size()));
    p.push_back(int32_t(a.path.size()));
    PushBytes(p, a.name);
    PushBytes(p, a.path);
  }
  p.push_back(int32_t(forget.size()));
  for (int64_t id : forget) PushId(p, id);
  p.push_back(int32_t(batch.size()));
  for (const SequenceStep& s : batch) {
    int32_t adapter = -1;
    for (size_t i = 0; s.adapter != nullptr && i < adapters.size(); ++i) {
      if (adapters[i].id == s.adapter->id()) adapter = int32_t(i);
    }
    PushId(p, s.seq_id);
    p.push_back(s.start_pos);
    p.push_back(int32_t(s.logits));
    p.push_back(int32_t(s.tokens.size()));
    p.push_back(int32_t(s.block_table.size()));
    p.push_back(int32_t(s.window_block_table.size()));
    p.push_back(adapter);
    p.push_back(FloatBits(s.adapter_scale));
    p.insert(p.end(), s.tokens.begin(), s.tokens.end());
    p.insert(p.end(), s.block_table.begin(), s.block_table.end());
    p.insert(p.end(), s.window_block_table.begin(), s.window_block_table.end());
  }
  return p;
}

StatusOr<DecodedStep> DecodeStep(const std::vector<int32_t>& p) {
  DecodedStep d;
  size_t i = 0;
  auto need = [&](size_t n) { return i + n <= p.size(); };
  const Status truncated = Internal("dist: truncated step message");
  if (!need(1)) return Internal("dist: empty step message");
  const int32_t n_adapters = p[i++];
  for (int32_t k = 0; k < n_adapters; ++k) {
    if (!need(6)) return truncated;
    StepAdapter a;
    a.id = ReadId(&p[i]);
    a.fresh = p[i + 2] != 0;
    a.default_scale = BitsFloat(p[i + 3]);
    const size_t name_bytes = size_t(uint32_t(p[i + 4])), path_bytes = size_t(uint32_t(p[i + 5]));
    i += 6;
    if (!need(Words(name_bytes) + Words(path_bytes))) return truncated;
    a.name.assign(reinterpret_cast<const char*>(p.data() + i), name_bytes);
    i += Words(name_bytes);
    a.path.assign(reinterpret_cast<const char*>(p.data() + i), path_bytes);
    i += Words(path_bytes);
    d.adapters.push_back(std::move(a));
  }
  if (!need(1)) return truncated;
  const int32_t n_forget = p[i++];
  if (n_forget < 0 || !need(2 * size_t(n_forget))) return truncated;
  for (int32_t k = 0; k < n_forget; ++k, i += 2) d.forget.push_back(ReadId(&p[i]));
  if (!need(1)) return truncated;
  const int32_t n = p[i++];
  for (int32_t k = 0; k < n; ++k) {
    if (!need(9)) return truncated;
    SequenceStep s;
    s.seq_id = ReadId(&p[i]);
    s.start_pos = p[i + 2];
    s.logits = static_cast<engine::LogitsMode>(p[i + 3]);
    const size_t n_tok = size_t(uint32_t(p[i + 4])), n_blk = size_t(uint32_t(p[i + 5])),
                 n_win = size_t(uint32_t(p[i + 6]));
    const int32_t adapter = p[i + 7];
    s.adapter_scale = BitsFloat(p[i + 8]);
    i += 9;
    if (adapter < -1 || adapter >= n_adapters) return Internal("dist: bad adapter in a step");
    if (!need(n_tok + n_blk + n_win)) return truncated;
    s.tokens = {p.data() + i, n_tok};
    s.block_table = {p.data() + i + n_tok, n_blk};
    s.window_block_table = {p.data() + i + n_tok + n_blk, n_win};
    i += n_tok + n_blk + n_win;
    d.batch.push_back(s);
    d.adapter_of.push_back(adapter);
  }
  return d;
}

StatusOr<bool> OnDevice(const runtime::Communicator* comm, const std::string& group,
                        const std::string& backend) {
  if (comm == nullptr || !comm->plugin().reads_device_memory()) return false;
  if (comm->plugin().device_plugin() == backend) return true;
  return FailedPrecondition("dist: the " + group + " group's comm plugin '" +
                            comm->plugin().name() + "' reads the device memory of backend '" +
                            comm->plugin().device_plugin() + "', but the model runs on '" +
                            backend + "'; choose a comm plugin for " + backend +
                            " or one that reads host memory");
}
}  // namespace polychip::dist
