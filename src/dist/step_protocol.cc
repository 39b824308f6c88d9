#include "dist/step_protocol.h"

namespace polychip::dist {

using engine::SequenceStep;

std::vector<int32_t> EncodeStep(std::span<const SequenceStep> batch) {
  std::vector<int32_t> p;
  p.push_back(int32_t(batch.size()));
  for (const SequenceStep& s : batch) {
    p.push_back(int32_t(uint64_t(s.seq_id) & 0xffffffffu));
    p.push_back(int32_t(uint64_t(s.seq_id) >> 32));
    p.push_back(s.start_pos);
    p.push_back(int32_t(s.logits));
    p.push_back(int32_t(s.tokens.size()));
    p.push_back(int32_t(s.block_table.size()));
    p.push_back(int32_t(s.window_block_table.size()));
    p.insert(p.end(), s.tokens.begin(), s.tokens.end());
    p.insert(p.end(), s.block_table.begin(), s.block_table.end());
    p.insert(p.end(), s.window_block_table.begin(), s.window_block_table.end());
  }
  return p;
}

StatusOr<std::vector<SequenceStep>> DecodeStep(const std::vector<int32_t>& p) {
  std::vector<SequenceStep> batch;
  size_t i = 0;
  auto need = [&](size_t n) { return i + n <= p.size(); };
  if (!need(1)) return Internal("dist: empty step message");
  const int32_t n = p[i++];
  for (int32_t k = 0; k < n; ++k) {
    if (!need(7)) return Internal("dist: truncated step message");
    SequenceStep s;
    s.seq_id = int64_t(uint64_t(uint32_t(p[i])) | (uint64_t(uint32_t(p[i + 1])) << 32));
    s.start_pos = p[i + 2];
    s.logits = static_cast<engine::LogitsMode>(p[i + 3]);
    const size_t n_tok = size_t(uint32_t(p[i + 4])), n_blk = size_t(uint32_t(p[i + 5])),
                 n_win = size_t(uint32_t(p[i + 6]));
    i += 7;
    if (!need(n_tok + n_blk + n_win)) return Internal("dist: truncated step message");
    s.tokens = {p.data() + i, n_tok};
    s.block_table = {p.data() + i + n_tok, n_blk};
    s.window_block_table = {p.data() + i + n_tok + n_blk, n_win};
    i += n_tok + n_blk + n_win;
    batch.push_back(s);
  }
  return batch;
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
