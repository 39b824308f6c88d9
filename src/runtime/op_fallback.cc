#include "runtime/op_fallback.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "polychip/sdk/op_list.h"
#include "polychip/sdk/ref_kernels.h"
#include "runtime/abi_internal.h"
#include "runtime/log.h"
#include "runtime/ops.h"

namespace polychip::runtime {

Status LaunchOnStream(const Stream& stream, pc_op_t op, void* args);  // ops.cc
bool AskOpSupports(const Device& device, const pc_op_query_t& query);  // ops.cc
// The first member of `args` appended after ABI 1.`minor` (and after the op itself) that is
// set (non-zero: a zero member means what its absence means), or nullptr.  ops.cc
const char* NewerMemberInUse(pc_op_t op, const void* args, uint32_t minor);

namespace {

using sdk::Access;
using sdk::Extent;

DType Cpp(pc_dtype_t d) { return static_cast<DType>(static_cast<int32_t>(d)); }

// A fallback-device buffer with the host copy that stages it.
struct Staged {
  DevPtr device_ptr = 0;  // on the main device
  uint64_t bytes = 0;
  bool read = false, written = false;
  std::unique_ptr<DeviceBuffer> buffer;  // on the fallback device
  std::vector<uint8_t> host;
};

// Copies main-device [ptr, ptr + bytes) into a new fallback-device buffer.
StatusOr<std::unique_ptr<DeviceBuffer>> StageIn(Stream& from, Stream& to, Device& fallback,
                                                DevPtr ptr, uint64_t bytes,
                                                std::vector<uint8_t>* host) {
  host->resize(bytes);
  PC_ASSIGN_OR_RETURN(auto buffer, fallback.Allocate(std::max<uint64_t>(bytes, 1)));
  if (ptr != 0 && bytes > 0) {
    PC_RETURN_IF_ERROR(from.CopyD2H(host->data(), ptr, bytes));
    PC_RETURN_IF_ERROR(from.Synchronize());
    PC_RETURN_IF_ERROR(to.CopyH2D(buffer->ptr(), host->data(), bytes));
  }
  return buffer;
}

// Copies the fallback buffer back into main-device [ptr, ptr + bytes) (after `to` finished).
Status StageOut(Stream& to_main, Stream& fallback_stream, const DeviceBuffer& buffer,
                DevPtr ptr, uint64_t bytes, std::vector<uint8_t>* host) {
  host->resize(bytes);
  PC_RETURN_IF_ERROR(fallback_stream.CopyD2H(host->data(), buffer.ptr(), bytes));
  PC_RETURN_IF_ERROR(fallback_stream.Synchronize());
  PC_RETURN_IF_ERROR(to_main.CopyH2D(ptr, host->data(), bytes));
  return to_main.Synchronize();  // host must outlive the copy
}

std::array<int64_t, 6> QueryKey(const pc_op_query_t& q) {
  return {q.op, q.dtypes[0], q.dtypes[1], q.dtypes[2], q.dtypes[3], q.layout};
}

// The op_supports query that `args` (the op's ABI struct) needs answered.
template <typename T>
pc_op_query_t QueryFor(const typename T::Args& args) {
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  q.op = T::kOp;
  for (auto& d : q.dtypes) d = PC_DTYPE_INVALID;
  int i = 0;
  T::Dtypes([&](auto member, const char* role, sdk::DtypeKind) {
    q.dtypes[i++] = DtypeMeant(args, role) ? args.*member : PC_DTYPE_INVALID;
  });
  if (i == 0) q.dtypes[0] = PC_DTYPE_F32;
  q.shape_class = PC_SHAPE_ANY;
  q.layout = PC_LAYOUT_GGUF;
  // An op with several weights (MOE) is asked about the private layout any of them has.
  T::Layout([&](auto member) {
    if (q.layout == PC_LAYOUT_GGUF) q.layout = args.*member;
  });
  return q;
}

}  // namespace

// The op_supports query a launch of `args` (op's ABI struct) needs answered (ops.cc).
pc_op_query_t OpQueryOf(pc_op_t op, const void* args) {
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  q.op = PC_OP_COUNT;  // an unknown op: no plugin says yes
  sdk::VisitOp(op, 0, [&](auto t) {
    q = QueryFor<decltype(t)>(*static_cast<const typename decltype(t)::Args*>(args));
    return 0;
  });
  return q;
}

OpFallback::OpFallback(std::shared_ptr<Device> fallback) : fallback_(std::move(fallback)) {}
OpFallback::~OpFallback() = default;

bool OpFallback::ShouldFallBack(const Device& device, int32_t op, const void* args) {
  std::optional<pc_op_query_t> query;
  sdk::VisitOp(static_cast<pc_op_t>(op), 0, [&](auto t) {
    query = QueryFor<decltype(t)>(*static_cast<const typename decltype(t)::Args*>(args));
    return 0;
  });
  if (!query) return false;
  // A member the device's plugin predates (ATTENTION's window for a 1.3 plugin): the op runs on
  // the fallback device when that one knows the member.
  const pc_op_t id = static_cast<pc_op_t>(op);
  if (NewerMemberInUse(id, args, device.backend()->abi_minor()) != nullptr) {
    return NewerMemberInUse(id, args, fallback_->backend()->abi_minor()) == nullptr &&
           AskOpSupports(*fallback_, *query);
  }
  const auto key = QueryKey(*query);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = supported_.find(key);
  if (it == supported_.end()) it = supported_.emplace(key, AskOpSupports(device, *query)).first;
  return !it->second;
}

std::map<std::string, uint64_t> OpFallback::LaunchCounts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launches_;
}

void OpFallback::MarkImmutable(DevPtr ptr, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  immutable_[ptr] = std::max(immutable_[ptr], bytes);
}

bool OpFallback::IsImmutable(DevPtr ptr, uint64_t bytes) const {
  auto it = immutable_.upper_bound(ptr);
  if (it == immutable_.begin()) return false;
  --it;
  return ptr + bytes <= it->first + it->second;
}

StatusOr<const DeviceWeight*> OpFallback::Weight(Stream& stream, DevPtr ptr, DType dtype,
                                                 int64_t rows, int64_t cols) {
  const std::string key = std::to_string(ptr) + "/" + std::to_string(static_cast<int>(dtype)) +
                          "/" + std::to_string(rows) + "/" + std::to_string(cols);
  auto it = weights_.find(key);
  if (it != weights_.end()) return it->second.get();
  const int64_t row_bytes = RowBytes(dtype, cols);
  if (row_bytes < 0) return InvalidArgument("weight row length not a multiple of its block");
  std::vector<uint8_t> host(static_cast<size_t>(row_bytes * rows));
  PC_RETURN_IF_ERROR(stream.CopyD2H(host.data(), ptr, host.size()));
  PC_RETURN_IF_ERROR(stream.Synchronize());
  PC_ASSIGN_OR_RETURN(auto w,
                      DeviceWeight::Upload(fallback_, dtype, rows, cols, host.data(), host.size()));
  const DeviceWeight* raw = w.get();
  weights_.emplace(key, std::move(w));
  return raw;
}

Status OpFallback::Launch(const Stream& main_stream, int32_t op, const void* args) {
  // The caller's stream is logically ours for the duration (copies are stream operations).
  Stream& stream = const_cast<Stream&>(main_stream);
  std::lock_guard<std::mutex> lock(mu_);
  if (stream_ == nullptr) {
    PC_ASSIGN_OR_RETURN(stream_, fallback_->CreateStream(0));
  }
  ++launches_[sdk::OpName(static_cast<pc_op_t>(op))];
  if (op == PC_OP_KV_STORE) return LaunchKvStore(stream, args);
  if (op == PC_OP_ATTENTION) return LaunchAttention(stream, args);
  return sdk::VisitOp(static_cast<pc_op_t>(op), Unimplemented("unknown op"), [&](auto t) {
    return LaunchGeneric<decltype(t)>(stream, *static_cast<const typename decltype(t)::Args*>(args));
  });
}

// Every address member staged by its access and extent (op list); equal addresses share one
// staged buffer, so in-place ops (out == x) stay in place.
template <typename T>
Status OpFallback::LaunchGeneric(Stream& stream, typename T::Args args) {
  using Args = typename T::Args;
  // The i-th Weight member has the i-th dtype and the i-th layout member (pc_ops.def).
  std::vector<pc_dtype_t> dtypes;
  T::Dtypes([&](auto member, const char*, sdk::DtypeKind) { dtypes.push_back(args.*member); });
  std::vector<uint32_t Args::*> layouts;
  T::Layout([&](auto member) { layouts.push_back(member); });
  size_t weight_index = 0;
  std::vector<Staged> staged;
  std::vector<std::pair<pc_devptr_t Args::*, size_t>> rewrites;  // member -> staged index
  Status status = Status::Ok();
  const Args original = args;
  bool private_layout = false;
  T::Layout([&](auto member) { private_layout = args.*member != PC_LAYOUT_GGUF; });
  if (private_layout) {
    return FailedPrecondition(std::string(T::kName) +
                              ": the weight is in the device's private layout, which the "
                              "fallback device cannot read");
  }
  T::Members(sdk::MemberVisitor{
      [](auto...) {},
      [&](auto member, const char*, Access access, auto extent_fn, uint32_t, size_t) {
        if (!status.ok()) return;
        const DevPtr ptr = original.*member;
        if (ptr == 0) return;
        Extent e = extent_fn(original);
        if (access == Access::kWeight) {
          const size_t index = weight_index++;
          const pc_dtype_t weight_dtype =
              dtypes.empty() ? PC_DTYPE_F32 : dtypes[std::min(index, dtypes.size() - 1)];
          const int64_t row_bytes = RowBytes(Cpp(weight_dtype), e.cols);
          const uint64_t bytes = row_bytes > 0 ? static_cast<uint64_t>(row_bytes * e.rows) : 0;
          if (IsImmutable(ptr, bytes)) {
            auto w = Weight(stream, ptr, Cpp(weight_dtype), e.rows, e.cols);
            if (!w.ok()) {
              status = w.status();
              return;
            }
            args.*member = (*w)->data();
            if (index < layouts.size()) args.*layouts[index] = (*w)->layout();
            return;
          }
          // Not a weight (e.g. hidden states gathered by EMBEDDING): staged like an input.
          access = Access::kIn;
          e.bytes = static_cast<int64_t>(bytes);
        }
        if (e.bytes <= 0) return;
        auto same = std::find_if(staged.begin(), staged.end(),
                                 [&](const Staged& s) { return s.device_ptr == ptr; });
        if (same == staged.end()) {
          staged.push_back(Staged{ptr, 0});
          same = staged.end() - 1;
        }
        same->bytes = std::max<uint64_t>(same->bytes, e.bytes);
        same->read |= access != Access::kOut;
        same->written |= access != Access::kIn;
        rewrites.emplace_back(member, same - staged.begin());
      }});
  PC_RETURN_IF_ERROR(status);
  for (Staged& s : staged) {
    if (s.read) {
      PC_ASSIGN_OR_RETURN(s.buffer,
                          StageIn(stream, *stream_, *fallback_, s.device_ptr, s.bytes, &s.host));
    } else {
      PC_ASSIGN_OR_RETURN(s.buffer, fallback_->Allocate(std::max<uint64_t>(s.bytes, 1)));
    }
  }
  for (auto& [member, index] : rewrites) args.*member = staged[index].buffer->ptr();
  PC_RETURN_IF_ERROR(LaunchOnStream(*stream_, T::kOp, &args));
  PC_RETURN_IF_ERROR(stream_->Synchronize());
  for (Staged& s : staged) {
    if (s.written) {
      PC_RETURN_IF_ERROR(StageOut(stream, *stream_, *s.buffer, s.device_ptr, s.bytes, &s.host));
    }
  }
  return Status::Ok();
}

// KV_STORE: the new K/V rows are converted on the fallback device into a cache of one slot per
// token (block size 1, slot t), then copied row by row into their slots of the real cache.
Status OpFallback::LaunchKvStore(Stream& stream, const void* raw) {
  pc_kv_store_args_t a = *static_cast<const pc_kv_store_args_t*>(raw);
  const int64_t n = a.n_tokens;
  if (n <= 0) return Status::Ok();
  // Bytes of one slot (every KV head's row) of each cache.
  const uint64_t k_bytes = uint64_t(a.n_kv_heads * sdk::RowBytes(a.cache_dtype, a.head_dim));
  const uint64_t v_bytes =
      uint64_t(a.n_kv_heads * sdk::RowBytes(sdk::KvStoreVDtype(a), a.head_dim));
  const uint64_t in_bytes = static_cast<uint64_t>(n * a.n_kv_heads * a.head_dim * 4);
  std::vector<int32_t> slots(n);
  PC_RETURN_IF_ERROR(stream.CopyD2H(slots.data(), a.slots, n * 4));
  std::vector<uint8_t> k_host, v_host;
  PC_ASSIGN_OR_RETURN(auto k, StageIn(stream, *stream_, *fallback_, a.k, in_bytes, &k_host));
  PC_ASSIGN_OR_RETURN(auto v, StageIn(stream, *stream_, *fallback_, a.v, in_bytes, &v_host));
  std::vector<int32_t> identity(n);
  for (int64_t t = 0; t < n; ++t) identity[t] = slots[t] < 0 ? -1 : static_cast<int32_t>(t);
  PC_ASSIGN_OR_RETURN(auto slot_buf, fallback_->Allocate(n * 4));
  PC_ASSIGN_OR_RETURN(auto k_rows, fallback_->Allocate(n * k_bytes));
  PC_ASSIGN_OR_RETURN(auto v_rows, fallback_->Allocate(n * v_bytes));
  PC_RETURN_IF_ERROR(stream_->CopyH2D(slot_buf->ptr(), identity.data(), n * 4));
  const pc_devptr_t k_cache = a.k_cache, v_cache = a.v_cache;
  a.k = k->ptr();
  a.v = v->ptr();
  a.k_cache = k_rows->ptr();
  a.v_cache = v_rows->ptr();
  a.slots = slot_buf->ptr();
  a.block_size = 1;
  PC_RETURN_IF_ERROR(LaunchOnStream(*stream_, PC_OP_KV_STORE, &a));
  std::vector<uint8_t> k_out(n * k_bytes), v_out(n * v_bytes);
  PC_RETURN_IF_ERROR(stream_->CopyD2H(k_out.data(), k_rows->ptr(), k_out.size()));
  PC_RETURN_IF_ERROR(stream_->CopyD2H(v_out.data(), v_rows->ptr(), v_out.size()));
  PC_RETURN_IF_ERROR(stream_->Synchronize());
  // Slot s of a [n_blocks, block_size, heads, dim] cache is row s: the same byte offset.
  Stream& main = stream;
  for (int64_t t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;
    const uint64_t slot = static_cast<uint64_t>(slots[t]);
    PC_RETURN_IF_ERROR(main.CopyH2D(k_cache + slot * k_bytes, &k_out[t * k_bytes], k_bytes));
    PC_RETURN_IF_ERROR(main.CopyH2D(v_cache + slot * v_bytes, &v_out[t * v_bytes], v_bytes));
  }
  return main.Synchronize();
}

// ATTENTION: the blocks the sequences reach are copied into a compact cache on the fallback
// device and the block tables renumbered to it.
Status OpFallback::LaunchAttention(Stream& stream, const void* raw) {
  pc_attention_args_t a = *static_cast<const pc_attention_args_t*>(raw);
  if (a.n_tokens <= 0 || a.n_seqs <= 0) return Status::Ok();
  Stream& main = stream;
  // Bytes of one block of each cache.
  const uint64_t k_block =
      uint64_t(a.block_size * a.n_kv_heads * sdk::RowBytes(a.cache_dtype, a.head_dim));
  const uint64_t v_block =
      uint64_t(a.block_size * a.n_kv_heads * sdk::RowBytes(sdk::AttentionVDtype(a), a.head_dim));
  std::vector<int32_t> seq_lens(a.n_seqs), query_start(a.n_seqs + 1);
  std::vector<int32_t> tables(a.n_seqs * a.max_blocks_per_seq);
  PC_RETURN_IF_ERROR(main.CopyD2H(seq_lens.data(), a.seq_lens, seq_lens.size() * 4));
  PC_RETURN_IF_ERROR(main.CopyD2H(query_start.data(), a.query_start, query_start.size() * 4));
  PC_RETURN_IF_ERROR(main.CopyD2H(tables.data(), a.block_tables, tables.size() * 4));
  PC_RETURN_IF_ERROR(main.Synchronize());
  std::map<int32_t, int32_t> compact;  // real block -> compact block
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t used = (seq_lens[s] + a.block_size - 1) / a.block_size;
    if (used > a.max_blocks_per_seq) return InvalidArgument("attention: seq_lens beyond tables");
    for (int64_t b = 0; b < used; ++b) {
      int32_t& entry = tables[s * a.max_blocks_per_seq + b];
      auto it = compact.emplace(entry, static_cast<int32_t>(compact.size())).first;
      entry = it->second;
    }
  }
  const uint64_t k_cache_bytes = std::max<uint64_t>(compact.size() * k_block, 1);
  const uint64_t v_cache_bytes = std::max<uint64_t>(compact.size() * v_block, 1);
  std::vector<uint8_t> k_host(k_cache_bytes), v_host(v_cache_bytes);
  for (auto [real, index] : compact) {
    const uint64_t block = static_cast<uint64_t>(real);
    PC_RETURN_IF_ERROR(main.CopyD2H(&k_host[index * k_block], a.k_cache + block * k_block, k_block));
    PC_RETURN_IF_ERROR(main.CopyD2H(&v_host[index * v_block], a.v_cache + block * v_block, v_block));
  }
  const uint64_t q_bytes = static_cast<uint64_t>(a.n_tokens * a.n_heads * a.head_dim * 4);
  std::vector<uint8_t> q_host;
  PC_ASSIGN_OR_RETURN(auto q, StageIn(stream, *stream_, *fallback_, a.q, q_bytes, &q_host));
  PC_ASSIGN_OR_RETURN(auto k_cache, fallback_->Allocate(k_cache_bytes));
  PC_ASSIGN_OR_RETURN(auto v_cache, fallback_->Allocate(v_cache_bytes));
  PC_ASSIGN_OR_RETURN(auto out, fallback_->Allocate(q_bytes));
  PC_ASSIGN_OR_RETURN(auto lens, fallback_->Allocate(seq_lens.size() * 4));
  PC_ASSIGN_OR_RETURN(auto starts, fallback_->Allocate(query_start.size() * 4));
  PC_ASSIGN_OR_RETURN(auto table_buf, fallback_->Allocate(std::max<size_t>(tables.size() * 4, 4)));
  PC_RETURN_IF_ERROR(stream_->CopyH2D(k_cache->ptr(), k_host.data(), k_cache_bytes));
  PC_RETURN_IF_ERROR(stream_->CopyH2D(v_cache->ptr(), v_host.data(), v_cache_bytes));
  PC_RETURN_IF_ERROR(stream_->CopyH2D(lens->ptr(), seq_lens.data(), seq_lens.size() * 4));
  PC_RETURN_IF_ERROR(stream_->CopyH2D(starts->ptr(), query_start.data(), query_start.size() * 4));
  PC_RETURN_IF_ERROR(stream_->CopyH2D(table_buf->ptr(), tables.data(), tables.size() * 4));
  const pc_devptr_t real_out = a.out;
  a.q = q->ptr();
  a.k_cache = k_cache->ptr();
  a.v_cache = v_cache->ptr();
  a.out = out->ptr();
  a.seq_lens = lens->ptr();
  a.query_start = starts->ptr();
  a.block_tables = table_buf->ptr();
  PC_RETURN_IF_ERROR(LaunchOnStream(*stream_, PC_OP_ATTENTION, &a));
  PC_RETURN_IF_ERROR(stream_->Synchronize());
  std::vector<uint8_t> out_host;
  return StageOut(stream, *stream_, *out, real_out, q_bytes, &out_host);
}

}  // namespace polychip::runtime
