// GGUF reader and writer: round trips of every metadata and tensor type; malformed files give
// a clear one-line error and never crash.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "model/gguf_writer.h"
#include "test_util.h"

namespace polychip::model {
namespace {

using testing::Patch;
using testing::ReadAll;
using testing::TempDir;
using testing::WriteAll;

std::unique_ptr<GgufFile> MustOpen(const std::string& path) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

// A small file with metadata of several kinds and two tensors ("ta", "tb"), as bytes.
std::string SmallFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 2);
  w.SetF32("llama.rope.freq_base", 10000.0f);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "cc"});
  w.SetI32Array("tokenizer.ggml.token_type", {1, 2, 3});
  static std::vector<float> a(64, 0.5f), b(32 * 2, -1.0f);
  EXPECT_TRUE(w.AddTensor("ta", {64}, DType::kF32, a.data()).ok());
  EXPECT_TRUE(w.AddTensor("tb", {32, 2}, DType::kF32, b.data()).ok());
  std::string path = (TempDir() / "small.gguf").string();
  EXPECT_TRUE(w.Write(path).ok());
  return ReadAll(path);
}

// Byte offset of the tensor info whose name is `name` (its length prefix).
size_t TensorInfoOffset(const std::string& bytes, const std::string& name) {
  std::string needle(8, '\0');
  uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle += name;
  size_t pos = bytes.rfind(needle);
  EXPECT_NE(pos, std::string::npos);
  return pos;
}

Status ParseError(std::string bytes) {
  auto f = GgufFile::FromBytes(std::move(bytes), "bad.gguf");
  return f.ok() ? Status::Ok() : f.status();
}

void ExpectOneLineError(const Status& s, const std::string& fragment) {
  ASSERT_FALSE(s.ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

TEST(GgufTest, RoundTripsEveryMetadataType) {
  GgufWriter w;
  w.SetU8("u8", 200);
  w.SetI8("i8", -100);
  w.SetU16("u16", 60000);
  w.SetI16("i16", -30000);
  w.SetU32("u32", 4000000000u);
  w.SetI32("i32", -2000000000);
  w.SetU64("u64", 1ull << 63);
  w.SetI64("i64", -(1ll << 62));
  w.SetF32("f32", 1.5f);
  w.SetF64("f64", -2.25);
  w.SetBool("bool", true);
  w.SetString("str", std::string("hé\0llo", 7));
  w.SetString("empty", "");
  w.SetStringArray("strs", {"x", "", "zz"});
  w.SetI32Array("i32s", {-1, 0, 7});
  w.SetI64Array("i64s", {1ll << 40, -3});
  w.SetF32Array("f32s", {0.25f, -8.0f});
  uint8_t bytes[] = {1, 2, 255};
  w.SetRawArray("u8s", GgufType::kU8, bytes, 3);
  w.SetU32("u32", 7);  // replacing keeps one entry
  std::string path = (TempDir() / "meta.gguf").string();
  ASSERT_TRUE(w.Write(path).ok());

  auto f = MustOpen(path);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 18u);
  EXPECT_EQ(f->Find("u8")->type, GgufType::kU8);
  EXPECT_EQ(f->GetU32("u8", 0), 200u);
  EXPECT_EQ(f->GetI64("i8", 0), -100);
  EXPECT_EQ(f->GetU32("u16", 0), 60000u);
  EXPECT_EQ(f->GetI64("i16", 0), -30000);
  EXPECT_EQ(f->GetU32("u32", 0), 7u);
  EXPECT_EQ(f->GetI64("i32", 0), -2000000000);
  EXPECT_EQ(f->Find("u64")->u, 1ull << 63);
  EXPECT_EQ(f->GetI64("i64", 0), -(1ll << 62));
  EXPECT_EQ(f->GetF32("f32", 0), 1.5f);
  EXPECT_EQ(f->GetF32("f64", 0), -2.25f);
  EXPECT_TRUE(f->GetBool("bool", false));
  EXPECT_EQ(f->GetString("str", ""), std::string("hé\0llo", 7));
  EXPECT_EQ(f->GetString("empty", "x"), "");
  EXPECT_EQ(*f->GetStringArray("strs"), (std::vector<std::string>{"x", "", "zz"}));
  EXPECT_EQ(*f->GetI32Array("i32s"), (std::vector<int32_t>{-1, 0, 7}));
  EXPECT_EQ(*f->GetIntArray("i64s"), (std::vector<int64_t>{1ll << 40, -3}));
  EXPECT_EQ(*f->GetF32Array("f32s"), (std::vector<float>{0.25f, -8.0f}));
  EXPECT_EQ(*f->GetIntArray("u8s"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(f->Find("u8s")->elem_type, GgufType::kU8);

  // Coercions and their limits.
  EXPECT_EQ(*f->GetF32("i32"), -2e9f);  // any number reads as float
  EXPECT_FALSE(f->GetU32("i32").ok());  // negative
  EXPECT_FALSE(f->GetU32("i64").ok());  // out of range
  EXPECT_FALSE(f->GetI64("u64").ok());  // 2^63 does not fit
  EXPECT_FALSE(f->GetI64("f32").ok());  // float is not an integer
  EXPECT_FALSE(f->GetString("u8").ok());
  EXPECT_FALSE(f->GetI32Array("strs").ok());
  EXPECT_FALSE(f->GetI32Array("i64s").ok());  // 2^40 overflows i32
  EXPECT_EQ(f->GetU32("missing", 42), 42u);
  EXPECT_EQ(f->GetString("missing", "def"), "def");
  EXPECT_EQ(f->GetU32("missing").status().code(), StatusCode::kNotFound);
}

TEST(GgufTest, RoundTripsNestedArraysThroughCopy) {
  // Build a nested array by hand: [[1, 2], [3]] of i32, then copy it through SetValue.
  std::vector<int32_t> a = {1, 2}, b = {3};
  GgufValue outer;
  outer.type = GgufType::kArray;
  outer.elem_type = GgufType::kArray;
  outer.count = 2;
  for (auto* v : {&a, &b}) {
    GgufValue inner;
    inner.type = GgufType::kArray;
    inner.elem_type = GgufType::kI32;
    inner.count = v->size();
    inner.raw = reinterpret_cast<const uint8_t*>(v->data());
    outer.items.push_back(inner);
  }
  GgufWriter w;
  w.SetValue("nested", outer);
  std::string p1 = (TempDir() / "nested1.gguf").string();
  ASSERT_TRUE(w.Write(p1).ok());
  auto f = MustOpen(p1);
  ASSERT_NE(f, nullptr);
  const GgufValue* v = f->Find("nested");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->elem_type, GgufType::kArray);
  ASSERT_EQ(v->items.size(), 2u);
  EXPECT_EQ(v->items[0].count, 2u);
  EXPECT_EQ(v->items[0].IntAt(1), 2);
  EXPECT_EQ(v->items[1].IntAt(0), 3);

  // Copying every value of a file through SetValue reproduces the metadata bytes exactly.
  GgufWriter copy;
  for (const auto& [key, value] : f->metadata()) copy.SetValue(key, value);
  std::string p2 = (TempDir() / "nested2.gguf").string();
  ASSERT_TRUE(copy.Write(p2).ok());
  EXPECT_EQ(ReadAll(p1), ReadAll(p2));
}

TEST(GgufTest, RoundTripsTensorsOfEveryType) {
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                         DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                         DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  const int64_t row = 256, rows = 3;
  std::vector<std::string> payloads;
  GgufWriter w;
  w.SetAlignment(64);
  std::mt19937 rng(1);
  for (DType t : types) {
    std::string bytes(static_cast<size_t>(RowBytes(t, row) * rows), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    payloads.push_back(bytes);
  }
  for (size_t i = 0; i < std::size(types); ++i) {
    ASSERT_TRUE(w.AddTensor(std::string("t.") + DTypeName(types[i]), {row, rows}, types[i],
                            payloads[i].data())
                    .ok());
  }
  EXPECT_FALSE(w.AddTensor("t.F32", {row}, DType::kF32, payloads[0].data()).ok());  // duplicate
  EXPECT_FALSE(w.AddTensor("odd", {100}, DType::kQ4_K, payloads[0].data()).ok());   // not a block
  std::string path = (TempDir() / "tensors.gguf").string();
  ASSERT_TRUE(w.Write(path).ok());

  auto f = MustOpen(path);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->alignment(), 64u);
  ASSERT_EQ(f->tensors().size(), std::size(types));
  for (size_t i = 0; i < std::size(types); ++i) {
    const GgufTensor* t = f->FindTensor(std::string("t.") + DTypeName(types[i]));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, types[i]);
    EXPECT_EQ(t->dims, (std::vector<int64_t>{row, rows}));
    EXPECT_EQ(t->n_elements, row * rows);
    EXPECT_EQ(t->n_rows(), rows);
    EXPECT_EQ(t->offset % 64, 0u);
    EXPECT_EQ((f->data_offset() + t->offset) % 64, 0u);
    ASSERT_EQ(t->n_bytes, payloads[i].size());
    EXPECT_EQ(std::memcmp(t->data, payloads[i].data(), t->n_bytes), 0) << DTypeName(types[i]);
  }
  EXPECT_EQ(f->FindTensor("nope"), nullptr);
}

TEST(GgufTest, ReadsVersion2) {
  std::string bytes = SmallFile();
  Patch<uint32_t>(bytes, 4, 2);
  auto f = GgufFile::FromBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->GetU32("llama.block_count", 0), 2u);
}

TEST(GgufTest, EveryTruncationIsAnErrorNeverACrash) {
  const std::string bytes = SmallFile();
  ASSERT_TRUE(GgufFile::FromBytes(bytes).ok());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    Status s = ParseError(bytes.substr(0, cut));
    ASSERT_FALSE(s.ok()) << "cut at " << cut << " of " << bytes.size() << " parsed";
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
  ExpectOneLineError(ParseError(bytes.substr(0, 3)), "too small");
  ExpectOneLineError(ParseError(bytes.substr(0, 16)), "truncated");
  ExpectOneLineError(ParseError(bytes.substr(0, 30)), "absurd tensor count 2: a 30-byte file");
  ExpectOneLineError(ParseError(bytes.substr(0, TensorInfoOffset(bytes, "tb") + 12)),
                     "truncated file: needs 4 bytes at offset");
  ExpectOneLineError(ParseError(bytes.substr(0, bytes.size() - 10)), "beyond the end of the file");
}

TEST(GgufTest, TruncatedFileOnDisk) {
  std::string bytes = SmallFile();
  std::string path = (TempDir() / "trunc.gguf").string();
  WriteAll(path, bytes.substr(0, bytes.size() / 2));
  auto f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(path), std::string::npos);  // errors name the file
  auto missing = GgufFile::Open((TempDir() / "does-not-exist.gguf").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  WriteAll(TempDir() / "empty.gguf", "");
  ExpectOneLineError(GgufFile::Open((TempDir() / "empty.gguf").string()).status(), "too small");
}

TEST(GgufTest, WrongMagic) {
  std::string bytes = SmallFile();
  bytes[0] = 'P';
  bytes[1] = 'K';
  bytes[2] = 3;
  ExpectOneLineError(ParseError(bytes), "not a GGUF file (magic \"PK\\x03F\"");
}

TEST(GgufTest, UnsupportedVersions) {
  std::string bytes = SmallFile();
  Patch<uint32_t>(bytes, 4, 1);
  Status s = ParseError(bytes);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  ExpectOneLineError(s, "unsupported GGUF version 1");
  Patch<uint32_t>(bytes, 4, 4);
  ExpectOneLineError(ParseError(bytes), "unsupported GGUF version 4");
  Patch<uint32_t>(bytes, 4, 0x03000000);  // a big-endian v3 file
  ExpectOneLineError(ParseError(bytes), "big-endian");
}

TEST(GgufTest, AbsurdCounts) {
  std::string bytes = SmallFile();
  Patch<uint64_t>(bytes, 8, 1ull << 50);
  ExpectOneLineError(ParseError(bytes), "absurd tensor count");
  bytes = SmallFile();
  Patch<uint64_t>(bytes, 16, ~0ull);
  ExpectOneLineError(ParseError(bytes), "absurd metadata count");
}

TEST(GgufTest, AbsurdStringAndArrayLengths) {
  std::string bytes = SmallFile();
  Patch<uint64_t>(bytes, 24, 1ull << 60);  // length of the first key
  ExpectOneLineError(ParseError(bytes), "string length");
  // The token array's element count.
  bytes = SmallFile();
  size_t key = bytes.find("tokenizer.ggml.tokens");
  ASSERT_NE(key, std::string::npos);
  size_t count_at = key + std::strlen("tokenizer.ggml.tokens") + 4 + 4;
  Patch<uint64_t>(bytes, count_at, 1ull << 40);
  ExpectOneLineError(ParseError(bytes), "array length");
  // An unknown value type.
  bytes = SmallFile();
  Patch<uint32_t>(bytes, key + std::strlen("tokenizer.ggml.tokens"), 99);
  ExpectOneLineError(ParseError(bytes), "unknown value type 99");
}

TEST(GgufTest, UnknownTensorType) {
  std::string bytes = SmallFile();
  size_t info = TensorInfoOffset(bytes, "tb");
  size_t type_at = info + 8 + 2 + 4 + 2 * 8;  // name, n_dims, dims
  Patch<int32_t>(bytes, type_at, 16);  // IQ2_XXS: a real ggml type that we do not support
  ExpectOneLineError(ParseError(bytes), "tensor 'tb' has unknown or unsupported type 16");
  Patch<int32_t>(bytes, type_at, 12345);
  ExpectOneLineError(ParseError(bytes), "unknown or unsupported type 12345");
  // Found by fuzz_gguf: a number outside pc_dtype_t's range was converted to the enum before
  // the lookup (undefined behaviour, reported by the asan preset's UBSan).
  for (int32_t type : {1802466304, std::numeric_limits<int32_t>::min(), -2, 64}) {
    Patch<int32_t>(bytes, type_at, type);
    ExpectOneLineError(ParseError(bytes),
                       "unknown or unsupported type " + std::to_string(type));
  }
}

TEST(GgufTest, TensorDataBeyondEof) {
  std::string bytes = SmallFile();
  size_t info = TensorInfoOffset(bytes, "tb");
  size_t offset_at = info + 8 + 2 + 4 + 2 * 8 + 4;
  Patch<uint64_t>(bytes, offset_at, 1ull << 20);  // aligned, but far past the end
  ExpectOneLineError(ParseError(bytes), "tensor 'tb' [32, 2] F32 ends at byte");
  Patch<uint64_t>(bytes, offset_at, 3);  // misaligned
  ExpectOneLineError(ParseError(bytes), "not a multiple of the alignment");
}

TEST(GgufTest, DuplicateNamesAndBadDims) {
  std::string bytes = SmallFile();
  size_t info = TensorInfoOffset(bytes, "tb");
  bytes[info + 8 + 1] = 'a';  // "tb" -> "ta"
  ExpectOneLineError(ParseError(bytes), "duplicate tensor name 'ta'");

  bytes = SmallFile();
  info = TensorInfoOffset(bytes, "tb");
  Patch<uint64_t>(bytes, info + 8 + 2 + 4, 1ull << 62);
  Patch<uint64_t>(bytes, info + 8 + 2 + 4 + 8, 1ull << 62);
  ExpectOneLineError(ParseError(bytes), "dimensions overflow");

  bytes = SmallFile();
  info = TensorInfoOffset(bytes, "tb");
  Patch<uint32_t>(bytes, info + 8 + 2, 9);
  ExpectOneLineError(ParseError(bytes), "9 dimensions");

  bytes = SmallFile();
  info = TensorInfoOffset(bytes, "tb");
  Patch<uint64_t>(bytes, info + 8 + 2 + 4, 1ull << 40);  // huge but no overflow
  ExpectOneLineError(ParseError(bytes), "larger than the file");
}

TEST(GgufTest, RandomCorruptionNeverCrashes) {
  const std::string good = SmallFile();
  std::mt19937 rng(7);
  int errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = good;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    auto f = GgufFile::FromBytes(bytes);
    if (!f.ok()) {
      ++errors;
      EXPECT_FALSE(f.status().message().empty());
    } else {
      // Whatever parsed must be internally consistent.
      for (const GgufTensor& t : (*f)->tensors()) {
        EXPECT_LE((*f)->data_offset() + t.offset + t.n_bytes, bytes.size());
      }
    }
  }
  EXPECT_GT(errors, 100);
}

TEST(GgufTest, ReadsRealVocabulary) {
  auto path = testing::VocabDir() / "ggml-vocab-qwen2.gguf";
  POLYCHIP_REQUIRE_VOCAB(path);
  auto f = MustOpen(path.string());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->GetString("general.architecture", ""), "qwen2");
  EXPECT_EQ(f->GetString("tokenizer.ggml.model", ""), "gpt2");
  EXPECT_EQ(f->GetString("tokenizer.ggml.pre", ""), "qwen2");
  EXPECT_EQ(f->GetU32("tokenizer.ggml.eos_token_id", 0), 151643u);
  EXPECT_EQ(f->GetU32("qwen2.context_length", 0), 32768u);
  EXPECT_FLOAT_EQ(f->GetF32("qwen2.rope.freq_base", 0), 1e6f);
  auto tokens = f->GetStringArrayView("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ((*tokens)->size(), 151936u);
  EXPECT_EQ((**tokens)[0], "!");
  EXPECT_EQ((**tokens)[2], "#");
  auto merges = f->GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok());
  EXPECT_EQ(merges->size(), 151387u);
  EXPECT_EQ((*merges)[2], "i n");
  EXPECT_EQ(f->GetI32Array("tokenizer.ggml.token_type")->size(), 151936u);
  EXPECT_TRUE(f->tensors().empty());

  auto spm = testing::VocabDir() / "ggml-vocab-llama-spm.gguf";
  POLYCHIP_REQUIRE_VOCAB(spm);
  auto g = MustOpen(spm.string());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->GetString("tokenizer.ggml.model", ""), "llama");
  EXPECT_TRUE(g->GetBool("tokenizer.ggml.add_bos_token", false));
  EXPECT_FALSE(g->GetBool("tokenizer.ggml.add_eos_token", true));
  EXPECT_EQ(g->GetF32Array("tokenizer.ggml.scores")->size(), 32000u);
  EXPECT_EQ(g->GetStringArray("tokenizer.ggml.tokens")->at(1), "<s>");
}

}  // namespace
}  // namespace polychip::model
