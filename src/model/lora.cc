#include "model/lora.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "model/gguf_writer.h"
#include "model/model_shapes.h"

namespace polychip::model {
namespace {

constexpr const char* kKindNames[kLoraKinds] = {
    "attn_q.weight", "attn_k.weight",  "attn_v.weight",  "attn_qkv.weight",    "attn_output.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "ffn_gate_inp.weight",
    "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsLoraType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0;
}

// Same as synth.cc's generator (a row's draws from its own seed).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
void FillNormal(uint64_t key, float std, float* out, int64_t n) {
  uint64_t state = key;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = ((SplitMix64(state) >> 11) + 1) * 0x1.0p-53;
    const double u2 = (SplitMix64(state) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(std * r * std::sin(2 * M_PI * u2));
  }
}
uint64_t HashName(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

int32_t LoraSlotOfTensor(const std::string& name, int64_t n_layer) {
  if (name == "output.weight") return LoraOutputSlot(n_layer);
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return -1;
  int64_t layer = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    layer = layer * 10 + (name[i] - '0');
    if (layer >= n_layer) return -1;
  }
  const std::string rest = name.substr(dot + 1);
  for (int32_t k = 0; k < kLoraKinds; ++k) {
    if (rest == kKindNames[k]) return LoraSlot(layer, static_cast<LoraKind>(k));
  }
  return -1;
}

StatusOr<std::shared_ptr<LoraAdapter>> LoraAdapter::Open(const std::string& path,
                                                         const ModelConfig& base) {
  PC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  auto fail = [&path](const std::string& why) {
    return InvalidArgument(fmt::format("LoRA adapter {}: {}", path, why));
  };
  const std::string type = file->GetString("general.type", "");
  if (type != "adapter") {
    return fail(fmt::format("general.type is '{}', not 'adapter' (a model, not a LoRA adapter?)",
                            type));
  }
  const std::string adapter_type = file->GetString("adapter.type", "");
  if (adapter_type != "lora") {
    return fail(fmt::format("adapter.type is '{}', not 'lora'", adapter_type));
  }
  const std::string arch = file->GetString("general.architecture", "");
  if (arch != ArchName(base.arch)) {
    return fail(fmt::format("architecture '{}' does not match the base model's '{}'", arch,
                            ArchName(base.arch)));
  }
  std::shared_ptr<LoraAdapter> a(new LoraAdapter());
  a->path_ = path;
  a->alpha_ = file->GetF32("adapter.lora.alpha", 0.0f);

  std::map<std::string, TensorSpec> specs;
  for (TensorSpec& s : ArchTensors(base)) specs.emplace(s.name, std::move(s));
  std::map<std::string, LoraPair> pairs;
  std::vector<std::string> order;
  for (const GgufTensor& t : file->tensors()) {
    const bool is_a = EndsWith(t.name, ".lora_a"), is_b = EndsWith(t.name, ".lora_b");
    if (!is_a && !is_b) {
      return fail(fmt::format("tensor '{}' is neither a .lora_a nor a .lora_b", t.name));
    }
    const std::string name = t.name.substr(0, t.name.size() - 7);
    const bool experts = EndsWith(name, "_exps.weight");  // one matrix per expert
    if (!IsLoraType(t.dtype) || t.dims.size() != (experts ? 3u : 2u)) {
      return fail(fmt::format("tensor '{}' is {} {}; expected {} of F32, F16, BF16 or Q8_0",
                              t.name, DTypeName(t.dtype), t.ShapeString(),
                              experts ? "one matrix per expert (3-D)" : "a matrix"));
    }
    auto spec = specs.find(name);
    if (spec == specs.end()) {
      return fail(fmt::format("tensor '{}' adapts '{}', which the base model ({}) does not have",
                              t.name, name, base.Summary()));
    }
    const int32_t slot = LoraSlotOfTensor(name, base.n_layer);
    if (slot < 0) {
      return fail(fmt::format("tensor '{}': LoRA on '{}' is not supported (attention, "
                              "feed-forward, router and output matrices are)",
                              t.name, name));
    }
    auto [it, fresh] = pairs.try_emplace(name);
    if (fresh) order.push_back(name);
    LoraPair& p = it->second;
    p.base = name;
    p.slot = slot;
    (is_a ? p.a : p.b) = &t;
  }
  if (order.empty()) return fail("no .lora_a/.lora_b tensors");
  for (const std::string& name : order) {
    LoraPair& p = pairs[name];
    if (p.a == nullptr || p.b == nullptr) {
      return fail(fmt::format("'{}' has {} but no {}", name, p.a ? ".lora_a" : ".lora_b",
                              p.a ? ".lora_b" : ".lora_a"));
    }
    const std::vector<int64_t>& w = specs[name].dims;  // {k, n} (experts: {k, n, n_expert})
    // A: dims {k, rank}; B: dims {rank, n} (experts: each with n_expert last).
    const bool experts_match = w.size() == p.a->dims.size() &&
                               (w.size() == 2 || (p.a->dims[2] == w[2] && p.b->dims[2] == w[2]));
    if (!experts_match || p.a->dims[0] != w[0] || p.b->dims[1] != w[1] ||
        p.a->dims[1] != p.b->dims[0]) {
      return fail(fmt::format("'{}' is {} in the base, but its lora_a is {} and lora_b {} "
                              "(expected [{}, r] and [r, {}])",
                              name, fmt::format("[{}, {}]", w[0], w[1]), p.a->ShapeString(),
                              p.b->ShapeString(), w[0], w[1]));
    }
    p.rank = p.a->dims[1];
    if (p.rank <= 0) return fail(fmt::format("'{}' has rank 0", name));
    a->max_rank_ = std::max(a->max_rank_, p.rank);
    a->pairs_.push_back(p);
  }
  a->file_ = std::move(file);
  return a;
}

const LoraPair* LoraAdapter::Find(int32_t slot) const {
  for (const LoraPair& p : pairs_) {
    if (p.slot == slot) return &p;
  }
  return nullptr;
}

StatusOr<std::shared_ptr<const LoraAdapter>> LoraAdapter::OpenReplica(
    const std::string& path, const ModelConfig& base, int64_t id, std::string name,
    float default_scale) {
  PC_ASSIGN_OR_RETURN(std::shared_ptr<LoraAdapter> a, Open(path, base));
  a->id_ = id;
  a->name_ = std::move(name);
  a->default_scale_ = default_scale;
  return std::shared_ptr<const LoraAdapter>(a);
}

StatusOr<LoraSpec> ParseLoraSpec(const std::string& text) {
  LoraSpec s;
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return InvalidArgument("expected NAME=PATH[:SCALE], not '" + text + "'");
  }
  s.name = text.substr(0, eq);
  for (char c : s.name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::strchr("-_./", c) == nullptr) {
      return InvalidArgument("adapter name '" + s.name + "': letters, digits and -_./ only");
    }
  }
  s.path = text.substr(eq + 1);
  const size_t colon = s.path.rfind(':');
  if (colon != std::string::npos) {
    const std::string tail = s.path.substr(colon + 1);
    char* end = nullptr;
    const float v = std::strtof(tail.c_str(), &end);
    if (!tail.empty() && end == tail.c_str() + tail.size()) {
      if (!std::isfinite(v)) return InvalidArgument("scale '" + tail + "' is not finite");
      s.scale = v;
      s.path = s.path.substr(0, colon);
    }
  }
  if (s.path.empty()) return InvalidArgument("expected NAME=PATH[:SCALE], not '" + text + "'");
  return s;
}

StatusOr<std::shared_ptr<const LoraAdapter>> LoraRegistry::Load(const LoraSpec& spec) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& a : adapters_) {
      if (a->name() == spec.name) {
        return InvalidArgument("a LoRA adapter named '" + spec.name + "' is already loaded");
      }
    }
  }
  PC_ASSIGN_OR_RETURN(std::shared_ptr<LoraAdapter> a, LoraAdapter::Open(spec.path, base_));
  a->name_ = spec.name;
  a->default_scale_ = spec.scale;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& other : adapters_) {
    if (other->name() == spec.name) {
      return InvalidArgument("a LoRA adapter named '" + spec.name + "' is already loaded");
    }
  }
  a->id_ = next_id_++;
  adapters_.push_back(a);
  return std::shared_ptr<const LoraAdapter>(a);
}

Status LoraRegistry::Unload(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = adapters_.begin(); it != adapters_.end(); ++it) {
    if ((*it)->name() == name) {
      adapters_.erase(it);
      return Status::Ok();
    }
  }
  return NotFound("no LoRA adapter named '" + name + "' is loaded");
}

std::shared_ptr<const LoraAdapter> LoraRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& a : adapters_) {
    if (a->name() == name) return a;
  }
  return nullptr;
}

std::shared_ptr<const LoraAdapter> LoraRegistry::FindByNameOrPath(const std::string& key) const {
  if (auto a = Find(key)) return a;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& a : adapters_) {
    if (a->path() == key) return a;
  }
  return nullptr;
}

std::vector<std::shared_ptr<const LoraAdapter>> LoraRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  return adapters_;
}

int64_t GroupLoraRuns(std::span<const LoraSegment> runs, int32_t* list,
                      runtime::DevPtr list_on_device, std::vector<LoraGroup>* groups) {
  const size_t first = groups->size();
  std::vector<std::vector<const LoraSegment*>> members;  // by group from `first`
  for (const LoraSegment& run : runs) {
    size_t g = first;
    while (g < groups->size() &&
           ((*groups)[g].lora != run.lora || (*groups)[g].scale != run.scale)) {
      ++g;
    }
    if (g == groups->size()) {
      groups->push_back({run.lora, run.scale, run.begin, 0, 0});
      members.emplace_back();
    }
    (*groups)[g].n_rows += run.rows;
    members[g - first].push_back(&run);
  }
  int64_t written = 0;
  for (size_t g = first; g < groups->size(); ++g) {
    if (members[g - first].size() == 1) continue;  // [begin, begin + n_rows)
    (*groups)[g].rows = list_on_device + uint64_t(written) * 4;
    for (const LoraSegment* run : members[g - first]) {
      for (int64_t r = 0; r < run->rows; ++r) list[written++] = int32_t(run->begin + r);
    }
  }
  return written;
}

bool LoraComposed() {
  const char* v = std::getenv("POLYCHIP_LORA_COMPOSED");
  return v != nullptr && std::string_view(v) == "1";
}

bool LoraExpertsForcedToHost() {
  const char* v = std::getenv("POLYCHIP_LORA_HOST_EXPERTS");
  return v != nullptr && std::string_view(v) == "1";
}

namespace {

bool IsLowRankType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0;
}

// The expert pairs of the layers this runner holds, as MOE's low-rank terms: each stacked A and
// B copied as it is into a buffer of its own. A layer whose A's (or B's) types differ between
// gate, up and down, or one larger than the device allocates at once, keeps no terms (its rows
// run on the host: transformer.cc). Experts are not split by tensor parallelism (a mixture of
// experts refuses --tp-size), so every rank takes them whole.
Status UploadExpertTerms(const LoraAdapter& adapter, const ModelConfig& config,
                         const std::shared_ptr<runtime::Device>& device, const LoraShard& shard,
                         DeviceLora& d) {
  if (config.n_expert == 0 || LoraExpertsForcedToHost()) return Status::Ok();
  std::unique_ptr<runtime::Stream> stream;
  const uint64_t max_alloc = device->props().max_alloc_size;
  for (int64_t layer = shard.layer_begin; layer < shard.layer_end; ++layer) {
    const LoraPair* p[3];
    const LoraPair* first = nullptr;
    for (int m = 0; m < 3; ++m) {
      p[m] = adapter.Find(LoraSlot(layer, static_cast<LoraKind>(kLoraGateExps + m)));
      if (first == nullptr) first = p[m];
    }
    if (first == nullptr) continue;
    bool fits = IsLowRankType(first->a->dtype) && IsLowRankType(first->b->dtype);
    for (const LoraPair* q : p) {
      if (q == nullptr) continue;
      fits = fits && q->a->dtype == first->a->dtype && q->b->dtype == first->b->dtype &&
             (max_alloc == 0 || (q->a->n_bytes <= max_alloc && q->b->n_bytes <= max_alloc));
    }
    if (!fits) continue;
    if (stream == nullptr) {
      PC_ASSIGN_OR_RETURN(stream, device->CreateStream(0));
    }
    auto terms = std::make_unique<DeviceLora::ExpertTerms>();
    terms->a_dtype = first->a->dtype;
    terms->b_dtype = first->b->dtype;
    auto upload = [&](const GgufTensor& t) -> StatusOr<runtime::DevPtr> {
      PC_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceBuffer> buffer,
                          device->Allocate(t.n_bytes));
      PC_RETURN_IF_ERROR(stream->CopyH2D(buffer->ptr(), t.data, t.n_bytes));
      const runtime::DevPtr ptr = buffer->ptr();
      d.bytes += t.n_bytes;
      d.buffers.push_back(std::move(buffer));
      return ptr;
    };
    for (int m = 0; m < 3; ++m) {
      if (p[m] == nullptr) continue;
      PC_ASSIGN_OR_RETURN(terms->a[m], upload(*p[m]->a));
      PC_ASSIGN_OR_RETURN(terms->b[m], upload(*p[m]->b));
      terms->rank[m] = p[m]->rank;
    }
    if (d.experts.empty()) d.experts.resize(size_t(config.n_layer));
    d.experts[size_t(layer)] = std::move(terms);
  }
  return stream != nullptr ? stream->Synchronize() : Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DeviceLora>> UploadLora(std::shared_ptr<const LoraAdapter> adapter,
                                                 const ModelConfig& config,
                                                 const std::shared_ptr<runtime::Device>& device,
                                                 const LoraShard& shard) {
  auto d = std::make_unique<DeviceLora>();
  d->by_slot.resize(size_t(LoraOutputSlot(config.n_layer) + 1));
  const bool q8 = runtime::SupportsOp(*device, runtime::Op::kMatmul, {DType::kQ8_0});
  // The part of t to upload as a MATMUL weight: rows [row_begin, row_begin + rows) (rows -1:
  // all), columns [col_begin, col_begin + cols) (cols -1: all), then `zero_rows` zero rows.
  struct Cut {
    int64_t row_begin = 0, rows = -1, col_begin = 0, cols = -1, zero_rows = 0;
  };
  auto upload = [&](const GgufTensor& t, const Cut& cut) -> StatusOr<MatrixRef> {
    const int64_t row_len = t.row_len(), row_bytes = RowBytes(t.dtype, row_len);
    const int64_t rows = cut.rows < 0 ? t.n_rows() : cut.rows;
    const int64_t cols = cut.cols < 0 ? row_len : cut.cols;
    if (cut.row_begin + rows > t.n_rows() || cut.col_begin + cols > row_len) {
      return InvalidArgument(fmt::format("LoRA {}: the tensor-parallel cut [{}+{}, {}+{}] is "
                                         "outside its {}",
                                         t.name, cut.row_begin, rows, cut.col_begin, cols,
                                         t.ShapeString()));
    }
    const bool whole_rows = cols == row_len;
    DType type = t.dtype;
    // As stored where the device multiplies the type and the rows are whole (a column cut of
    // F32 or F16 is a byte range of each row too); else F32.
    const bool as_stored = type == DType::kF32 || type == DType::kF16 ||
                           (type == DType::kQ8_0 && q8 && whole_rows);
    const int64_t out_rows = rows + cut.zero_rows;
    std::vector<uint8_t> staging;
    const uint8_t* data = t.data + cut.row_begin * row_bytes;
    uint64_t bytes = uint64_t(rows * row_bytes);
    if (as_stored && (!whole_rows || cut.zero_rows > 0)) {
      const int64_t take = RowBytes(type, cols), skip = RowBytes(type, cut.col_begin);
      staging.assign(uint64_t(out_rows * take), 0);  // zero bytes are zero in every type
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(staging.data() + r * take, data + r * row_bytes + skip, take);
      }
      data = staging.data();
      bytes = staging.size();
    } else if (!as_stored) {
      std::vector<float> row(size_t(row_len), 0.0f);
      staging.assign(uint64_t(out_rows * cols) * 4, 0);
      for (int64_t r = 0; r < rows; ++r) {
        PC_CHECK(DequantizeRow(t.dtype, data + r * row_bytes, row.data(), row_len));
        std::memcpy(staging.data() + uint64_t(r * cols) * 4, row.data() + cut.col_begin,
                    uint64_t(cols) * 4);
      }
      type = DType::kF32;
      data = staging.data();
      bytes = staging.size();
    }
    PC_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceWeight> w,
                        runtime::DeviceWeight::Upload(device, type, out_rows, cols, data, bytes));
    MatrixRef m;
    m.data = w->data();
    m.dtype = w->dtype();
    m.layout = w->layout();
    m.rows = out_rows;
    m.cols = cols;
    d->bytes += w->bytes();
    d->weights.push_back(std::move(w));
    return m;
  };
  const int32_t output_slot = LoraOutputSlot(config.n_layer);
  const int64_t r = shard.tp_rank, n = shard.tp_size;
  for (const LoraPair& p : adapter->pairs()) {
    const bool is_output = p.slot == output_slot;
    const int64_t layer = p.slot / kLoraKinds;
    const int32_t kind = p.slot % kLoraKinds;
    if (is_output ? !shard.output : (layer < shard.layer_begin || layer >= shard.layer_end)) {
      continue;
    }
    if (!is_output && IsExpertsKind(kind)) continue;  // MOE's terms, below
    // Each part the runner multiplies by: its slot, the cut of A, the cut of B. A fused matrix
    // (phi3's attn_qkv, and ffn_up holding gate then up) runs as its parts (model_loader.cc):
    // A is shared, B cut by the same rows.
    struct Part {
      int32_t slot;
      Cut b;
    };
    Cut a_cut;
    std::vector<Part> parts;
    auto rows = [](int64_t begin, int64_t count) { return Cut{begin, count}; };
    if (is_output) {
      parts = {{p.slot, n == 1 ? Cut{} : Cut{shard.vocab.begin, shard.vocab.count, 0, -1,
                                             shard.vocab.rows - shard.vocab.count}}};
    } else if (kind == kLoraQkv) {
      const int64_t q = config.q_dim(), kv = config.kv_dim(), v = config.v_dim();
      parts = {{LoraSlot(layer, kLoraQ), rows(r * q, q)},
               {LoraSlot(layer, kLoraK), rows(n * q + r * kv, kv)},
               {LoraSlot(layer, kLoraV), rows(n * (q + kv) + r * v, v)}};
    } else if (kind == kLoraUp && config.fused_gate_up) {
      const int64_t f = config.n_ff;
      parts = {{LoraSlot(layer, kLoraGate), rows(r * f, f)},
               {LoraSlot(layer, kLoraUp), rows(n * f + r * f, f)}};
    } else if (n == 1 || kind == kLoraRouter) {
      parts = {{p.slot, Cut{}}};
    } else if (kind == kLoraO || kind == kLoraDown) {  // row-parallel: A's columns
      const int64_t k = kind == kLoraO ? config.q_dim() : config.n_ff;
      a_cut = Cut{0, -1, r * k, k};
      parts = {{p.slot, Cut{}}};
    } else {  // column-parallel (q, k, v, gate, up): B's rows
      const int64_t dim = kind == kLoraQ   ? config.q_dim()
                          : kind == kLoraK ? config.kv_dim()
                          : kind == kLoraV ? config.v_dim()
                                           : config.n_ff;
      parts = {{p.slot, rows(r * dim, dim)}};
    }
    PC_ASSIGN_OR_RETURN(MatrixRef a, upload(*p.a, a_cut));
    for (const Part& part : parts) {
      DeviceLora::Matrix& m = d->by_slot[size_t(part.slot)];
      m.a = a;
      PC_ASSIGN_OR_RETURN(m.b, upload(*p.b, part.b));
      m.rank = p.rank;
    }
  }
  PC_RETURN_IF_ERROR(UploadExpertTerms(*adapter, config, device, shard, *d));
  d->adapter = std::move(adapter);
  return d;
}

Status LoraCache::Prepare(const std::vector<std::shared_ptr<const LoraAdapter>>& wanted,
                          const ModelConfig& config, const LoraShard& shard) {
  if (int64_t(wanted.size()) > capacity_) {
    return ResourceExhausted(fmt::format("{} LoRA adapters in one step; at most {} are resident "
                                         "(--max-loras-per-batch)",
                                         wanted.size(), capacity_));
  }
  std::set<int64_t> ids;
  for (const auto& a : wanted) ids.insert(a->id());
  // Those already resident move to the front (most recently used).
  for (auto it = resident_.begin(); it != resident_.end();) {
    auto next = std::next(it);
    if (ids.count((*it)->adapter->id())) resident_.splice(resident_.begin(), resident_, it);
    it = next;
  }
  for (const auto& a : wanted) {
    if (Get(a->id()) != nullptr) continue;
    while (int64_t(resident_.size()) >= capacity_) {
      PC_CHECK(!ids.count(resident_.back()->adapter->id()));
      resident_.pop_back();  // least recently used, not in this step
    }
    PC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceLora> d,
                        UploadLora(a, config, device_, shard));
    resident_.push_front(std::move(d));
    ++uploads_;
  }
  max_rank_ = 0;
  for (const auto& d : resident_) max_rank_ = std::max(max_rank_, d->adapter->max_rank());
  return Status::Ok();
}

const DeviceLora* LoraCache::Get(int64_t id) const {
  for (const auto& d : resident_) {
    if (d->adapter->id() == id) return d.get();
  }
  return nullptr;
}

Status SynthesizeLora(const GgufFile& base, const LoraSynthOptions& opts, const std::string& out) {
  if (!IsLoraType(opts.type)) {
    return InvalidArgument(fmt::format("LoRA type {}: F32, F16, BF16 or Q8_0", DTypeName(opts.type)));
  }
  if (opts.rank <= 0) return InvalidArgument("the rank must be positive");
  PC_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::FromGguf(base));
  for (const std::string& t : opts.targets) {
    if (t != "attn" && t != "ffn" && t != "experts" && t != "output") {
      return InvalidArgument("LoRA target '" + t + "': attn, ffn, experts or output");
    }
  }
  auto wants = [&](const std::string& t) {
    return std::find(opts.targets.begin(), opts.targets.end(), t) != opts.targets.end();
  };
  GgufWriter w;
  w.SetString("general.architecture", ArchName(c.arch));
  w.SetString("general.type", "adapter");
  w.SetString("general.name", "polychip synthetic LoRA");
  w.SetString("adapter.type", "lora");
  w.SetF32("adapter.lora.alpha", opts.alpha);
  for (const TensorSpec& spec : ArchTensors(c)) {
    const int32_t slot = LoraSlotOfTensor(spec.name, c.n_layer);
    if (slot < 0) continue;
    const int32_t kind = slot % kLoraKinds;
    const bool is_output = slot == LoraOutputSlot(c.n_layer);
    const bool attn = !is_output && kind <= kLoraO;
    const bool experts = !is_output && IsExpertsKind(kind);
    if (spec.dims.size() != (experts ? 3u : 2u)) continue;
    if (is_output ? !wants("output")
        : attn    ? !wants("attn")
        : experts ? !wants("experts")
                  : !wants("ffn")) {
      continue;
    }
    const int64_t k = spec.dims[0], n = spec.dims[1], r = opts.rank;
    // Experts: one pair per expert, stacked ([n_expert, r, k] and [n_expert, n, r]).
    const int64_t n_expert = experts ? spec.dims[2] : 1;
    // Q8_0 needs rows of whole blocks: B's rows are `rank` long.
    const DType a_type = opts.type;
    const DType b_type = RowBytes(opts.type, r) < 0 ? DType::kF16 : opts.type;
    if (RowBytes(a_type, k) < 0) continue;
    for (int half = 0; half < 2; ++half) {
      const std::string name = spec.name + (half == 0 ? ".lora_a" : ".lora_b");
      const int64_t rows = (half == 0 ? r : n) * n_expert, cols = half == 0 ? k : r;
      const DType type = half == 0 ? a_type : b_type;
      const uint64_t key = opts.seed * 0x9E3779B97F4A7C15ull ^ HashName(name);
      const float std = opts.std;
      std::vector<int64_t> dims = {cols, half == 0 ? r : n};
      if (experts) dims.push_back(n_expert);
      PC_RETURN_IF_ERROR(w.AddTensor(
          name, dims, type, [=](uint8_t* dst, uint64_t) -> Status {
            std::vector<float> row(static_cast<size_t>(cols));
            const int64_t row_bytes = RowBytes(type, cols);
            for (int64_t i = 0; i < rows; ++i) {
              FillNormal(key + uint64_t(i) * 0xD1B54A32D192ED03ull, std, row.data(), cols);
              if (!QuantizeRow(type, row.data(), dst + i * row_bytes, cols)) {
                return Internal(fmt::format("cannot write {} as {}", name, DTypeName(type)));
              }
            }
            return Status::Ok();
          }));
    }
  }
  if (w.tensor_count() == 0) return InvalidArgument("no matrix of the base matches the targets");
  return w.Write(out);
}

}  // namespace polychip::model

namespace polychip::model {

Status MergeLora(const std::string& base_path, const std::string& adapter_path, float scale,
                 const std::string& out) {
  PC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> base, GgufFile::Open(base_path));
  PC_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromGguf(*base));
  PC_ASSIGN_OR_RETURN(std::shared_ptr<LoraAdapter> adapter,
                      LoraAdapter::Open(adapter_path, config));
  std::map<std::string, const LoraPair*> by_name;
  for (const LoraPair& p : adapter->pairs()) by_name[p.base] = &p;

  GgufWriter w;
  for (const auto& [key, value] : base->metadata()) {
    if (key == "general.alignment") {
      w.SetAlignment(static_cast<uint32_t>(value.u));
      continue;
    }
    w.SetValue(key, value);
  }
  for (const GgufTensor& t : base->tensors()) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      PC_RETURN_IF_ERROR(w.AddTensor(t.name, t.dims, t.dtype, t.data));
      continue;
    }
    const LoraPair& p = *it->second;
    const float factor = adapter->Factor(p.rank, scale);
    const GgufTensor* tensor = &t;
    PC_RETURN_IF_ERROR(w.AddTensor(
        t.name, t.dims, t.dtype, [tensor, &p, factor](uint8_t* dst, uint64_t) -> Status {
          const int64_t k = tensor->row_len(), n = tensor->n_rows(), r = p.rank;
          // Experts' 3-D tensors: rows [e * per, (e + 1) * per) are expert e's, whose pair is
          // A's rows [e * r, (e + 1) * r) and B's same rows as W's.
          const int64_t per = tensor->dims.size() == 3 ? tensor->dims[1] : n;
          const int64_t a_rows = r * (n / per);
          // A [a_rows, k] and B [n, r] as F32.
          std::vector<float> a(static_cast<size_t>(a_rows * k)), b(static_cast<size_t>(n * r));
          std::vector<float> row(static_cast<size_t>(k));
          const int64_t a_bytes = RowBytes(p.a->dtype, k), b_bytes = RowBytes(p.b->dtype, r);
          for (int64_t i = 0; i < a_rows; ++i) {
            PC_CHECK(DequantizeRow(p.a->dtype, p.a->data + i * a_bytes, a.data() + i * k, k));
          }
          for (int64_t i = 0; i < n; ++i) {
            PC_CHECK(DequantizeRow(p.b->dtype, p.b->data + i * b_bytes, b.data() + i * r, r));
          }
          const int64_t w_bytes = RowBytes(tensor->dtype, k);
          for (int64_t i = 0; i < n; ++i) {  // W[i, :] += factor * sum_j B[i, j] A[j, :]
            PC_CHECK(DequantizeRow(tensor->dtype, tensor->data + i * w_bytes, row.data(), k));
            const float* a_e = a.data() + (i / per) * r * k;
            for (int64_t j = 0; j < r; ++j) {
              const float bij = factor * b[size_t(i * r + j)];
              const float* aj = a_e + j * k;
              for (int64_t c = 0; c < k; ++c) row[size_t(c)] += bij * aj[c];
            }
            if (!QuantizeRow(tensor->dtype, row.data(), dst + i * w_bytes, k)) {
              return Internal("cannot write " + tensor->name + " as " + DTypeName(tensor->dtype));
            }
          }
          return Status::Ok();
        }));
  }
  return w.Write(out);
}

}  // namespace polychip::model
