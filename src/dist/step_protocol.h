// What rank 0 tells the other ranks each step, and how hidden states cross a communicator:
// in place on the device when the comm plugin reads the device's memory, else staged through
// host memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "util/status.h"

namespace polychip::dist {

// Each step: a header {kind, payload int32 count} then the payload, both broadcast from rank 0.
// payload: the adapters table (n_adapters, then per adapter: id (2 words), fresh, default
// scale (float bits), name bytes, path bytes, the name then the path, each in 4-byte words),
// the ids the other ranks may forget (n_forget, 2 words each), then n_seqs, then per sequence:
// seq_id (2 words), start_pos, logits mode, n_tokens, n_blocks, n_window_blocks, adapter (index
// into the table, -1: the base), adapter scale (float bits), tokens..., blocks..., window
// blocks...
enum StepKind : int64_t { kStop = 0, kStep = 1 };

// A LoRA adapter a step uses, as the other ranks learn it: they open `path` themselves (the
// first time rank 0 sends it, `fresh`, after which every rank says whether it could) and keep
// it under rank 0's id until rank 0 says to forget it (unloaded and out of every device cache).
struct StepAdapter {
  int64_t id = 0;
  bool fresh = false;
  float default_scale = 1;
  std::string name, path;
};

// A step as a follower decodes it: the sequences' adapters are left null, `adapter_of` giving
// each one's index into `adapters` (-1: the base) for the follower to resolve.
struct DecodedStep {
  std::vector<engine::SequenceStep> batch;
  std::vector<int32_t> adapter_of;
  std::vector<StepAdapter> adapters;
  std::vector<int64_t> forget;
};

// `adapters` must hold every adapter of `batch` (by id).
std::vector<int32_t> EncodeStep(std::span<const engine::SequenceStep> batch,
                                std::span<const StepAdapter> adapters = {},
                                std::span<const int64_t> forget = {});
// The steps point into `payload`, which must outlive them.
StatusOr<DecodedStep> DecodeStep(const std::vector<int32_t>& payload);

// The hooks of the model, one per communicator. A comm plugin that reads this backend's device
// memory (as NCCL or BKCL do) gets the hidden states where they are, on the runner's stream,
// with no copy (`on_device`); otherwise they go through a host buffer (D2H, collective, H2D),
// whose bytes `staged_bytes` counts for /metrics.
struct HostStaging {
  runtime::Communicator* comm = nullptr;
  int64_t n_embd = 0;
  bool on_device = false;
  std::vector<float> host;  // [n_rows, n_embd]
  std::atomic<uint64_t> staged_bytes{0};  // through host memory, both directions

  HostStaging() = default;
  HostStaging(runtime::Communicator* c, int64_t embd) : comm(c), n_embd(embd) {}

  // The hooks receive the runner's stream as const (as every launch does); copies need it
  // mutable, and the runner owns it, so this is safe. `host` stays untouched until the next
  // call, which synchronizes the stream before writing it.
  Status ToHost(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows) {
    auto& s = const_cast<runtime::Stream&>(stream);
    host.resize(uint64_t(n_rows) * n_embd);
    staged_bytes += host.size() * 4;
    PC_RETURN_IF_ERROR(s.CopyD2H(host.data(), x, host.size() * 4));
    return s.Synchronize();
  }
  Status ToDevice(const runtime::Stream& stream, runtime::DevPtr x) {
    staged_bytes += host.size() * 4;
    return const_cast<runtime::Stream&>(stream).CopyH2D(x, host.data(), host.size() * 4);
  }
  Status AllReduce(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows) {
    const uint64_t n = uint64_t(n_rows) * n_embd;
    if (on_device) return comm->AllReduceOn(stream, x, x, n, DType::kF32, runtime::ReduceOp::kSum);
    PC_RETURN_IF_ERROR(ToHost(stream, x, n_rows));
    PC_RETURN_IF_ERROR(comm->AllReduce(host.data(), host.data(), host.size(), DType::kF32,
                                       runtime::ReduceOp::kSum));
    return ToDevice(stream, x);
  }
  Status Send(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows, int32_t peer) {
    if (on_device) return comm->SendOn(stream, x, uint64_t(n_rows) * n_embd, DType::kF32, peer);
    PC_RETURN_IF_ERROR(ToHost(stream, x, n_rows));
    return comm->Send(host.data(), host.size(), DType::kF32, peer);
  }
  Status Recv(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows, int32_t peer) {
    if (on_device) return comm->RecvOn(stream, x, uint64_t(n_rows) * n_embd, DType::kF32, peer);
    PC_RETURN_IF_ERROR(const_cast<runtime::Stream&>(stream).Synchronize());
    host.resize(uint64_t(n_rows) * n_embd);
    PC_RETURN_IF_ERROR(comm->Recv(host.data(), host.size(), DType::kF32, peer));
    return ToDevice(stream, x);
  }
};

// Whether `comm` reads the memory of `backend`'s devices; FAILED_PRECONDITION when it reads
// another backend's (it cannot take host memory, and this one's memory is not what it reads).
StatusOr<bool> OnDevice(const runtime::Communicator* comm, const std::string& group,
                        const std::string& backend);

}  // namespace polychip::dist
