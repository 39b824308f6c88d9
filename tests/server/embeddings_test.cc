// /v1/embeddings of the real `polychip serve` on the tiny synthesized model: the OpenAI shape
// (float and base64, usage), unit-length vectors of the model's width in the request's order,
// the 400s of what is not supported, and agreement with llama.cpp's llama-embedding (cosine
// >= 0.999 per input, mean and last pooling). The openai npm client reads the base64 form.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

constexpr int kWidth = 128;  // the "tiny" shape's embedding_length
const std::vector<std::string> kInputs = {
    "The keeper climbed the steps of the lighthouse.",
    "Ships passed in the night, far from the rocks, and nobody on board saw the light.",
    "42",
};

using Vec = std::vector<double>;

Vec ToVec(const json& a) {
  Vec v;
  for (const json& x : a) v.push_back(x.get<double>());
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}
double Norm(const Vec& a) { return std::sqrt(Dot(a, a)); }
double Cosine(const Vec& a, const Vec& b) { return Dot(a, b) / (Norm(a) * Norm(b)); }

// The floats of a base64 string of little-endian float32 (decoded here, not by the server).
Vec FromBase64(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) break;  // padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  Vec out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    out[i] = f;
  }
  return out;
}

std::vector<Vec> Embeddings(const json& response) {
  std::vector<Vec> out;
  for (const json& d : response["data"]) out.push_back(ToVec(d["embedding"]));
  return out;
}

TEST(Embeddings, OpenAiShape) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--served-model-name", "tiny", "--chunked-prefill-size", "8"});
  ASSERT_TRUE(s.ok());

  auto [status, batch] = s.Post("/v1/embeddings", {{"model", "tiny"}, {"input", kInputs}});
  ASSERT_EQ(status, 200) << batch.dump();
  EXPECT_EQ(batch["object"], "list");
  EXPECT_EQ(batch["model"], "tiny");
  ASSERT_EQ(batch["data"].size(), kInputs.size());
  int64_t tokens = 0;
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& text : kInputs) {
    auto [st, tok] = s.Post("/v1/tokenize", {{"text", text}});
    ASSERT_EQ(st, 200);
    ids.push_back(tok["tokens"].get<std::vector<int32_t>>());
    tokens += static_cast<int64_t>(ids.back().size());
  }
  EXPECT_EQ(batch["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(batch["usage"]["total_tokens"], tokens);
  const std::vector<Vec> vecs = Embeddings(batch);
  for (size_t i = 0; i < vecs.size(); ++i) {
    EXPECT_EQ(batch["data"][i]["object"], "embedding");
    EXPECT_EQ(batch["data"][i]["index"], i);
    ASSERT_EQ(vecs[i].size(), static_cast<size_t>(kWidth));
    EXPECT_NEAR(Norm(vecs[i]), 1.0, 1e-5) << "input " << i;
  }
  // Different texts, different vectors; the longer inputs span several prefill chunks (8).
  EXPECT_LT(Cosine(vecs[0], vecs[1]), 0.999);
  EXPECT_LT(Cosine(vecs[1], vecs[2]), 0.999);

  // Each input alone (string, then its token ids) gives its vector of the batch: the order is
  // the request's, and batching changes nothing.
  for (size_t i = 0; i < kInputs.size(); ++i) {
    auto [st1, one] = s.Post("/v1/embeddings", {{"input", kInputs[i]}});
    ASSERT_EQ(st1, 200) << one.dump();
    EXPECT_GT(Cosine(Embeddings(one)[0], vecs[i]), 0.99999) << "input " << i;
    auto [st2, by_ids] = s.Post("/v1/embeddings", {{"input", ids[i]}});
    ASSERT_EQ(st2, 200) << by_ids.dump();
    EXPECT_GT(Cosine(Embeddings(by_ids)[0], vecs[i]), 0.99999) << "input " << i;
  }
  auto [st3, arrays] = s.Post("/v1/embeddings", {{"input", json(ids)}});
  ASSERT_EQ(st3, 200) << arrays.dump();
  ASSERT_EQ(arrays["data"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_GT(Cosine(Embeddings(arrays)[i], vecs[i]), 0.99999) << "input " << i;
  }

  // base64: the same floats, exactly.
  auto [st4, b64] =
      s.Post("/v1/embeddings", {{"input", kInputs}, {"encoding_format", "base64"}, {"user", "u"}});
  ASSERT_EQ(st4, 200) << b64.dump();
  for (size_t i = 0; i < kInputs.size(); ++i) {
    const json& e = b64["data"][i]["embedding"];
    ASSERT_TRUE(e.is_string()) << e.dump();
    const Vec v = FromBase64(e.get<std::string>());
    ASSERT_EQ(v.size(), static_cast<size_t>(kWidth));
    for (int j = 0; j < kWidth; ++j) EXPECT_FLOAT_EQ(v[j], vecs[i][j]);
  }

  // The model's own width is accepted as `dimensions`; any other is refused, not truncated.
  EXPECT_EQ(s.Post("/v1/embeddings", {{"input", "x"}, {"dimensions", kWidth}}).first, 200);
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"input", "x"}, {"dimensions", 64}}, "dimensions"},
      {{{"input", "x"}, {"encoding_format", "int8"}}, "encoding_format"},
      {{{"input", ""}}, "input"},
      {{{"input", json::array()}}, "input"},
      {{{"input", {1, -3}}}, "input"},
      {{{"input", {json::array({1}), 5}}}, "input"},
      {json::object(), "input"},
      {{{"input", "x"}, {"pooling", "cls"}}, "pooling"},
  };
  for (const auto& [body, param] : bad) {
    auto [st, err] = s.Post("/v1/embeddings", body);
    EXPECT_EQ(st, 400) << body.dump() << " -> " << err.dump();
    EXPECT_EQ(err["error"]["param"], param) << body.dump() << " -> " << err.dump();
  }
  EXPECT_EQ(s.Post("/v1/embeddings", {{"input", "x"}, {"model", "other"}}).first, 404);

  // Generation still works beside it, and embeddings leave no KV blocks held.
  auto [st5, gen] = s.Post("/v1/completions", {{"prompt", kInputs[0]}, {"max_tokens", 4}});
  EXPECT_EQ(st5, 200) << gen.dump();
  // The gauges are published at the end of the engine's step, just after the last response.
  for (int i = 0; i < 250 && s.Metric("polychip_kv_blocks_used") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(s.Metric("polychip_kv_blocks_used"), 0);
}

// The official client asks for base64 by default and decodes it itself.
TEST(Embeddings, OpenAiClient) {
  PC_REQUIRE_SERVE_DEPS(model);
  const fs::path npm = NpmDir();
  ASSERT_EQ(RunCommand("node --version >/dev/null 2>&1").exit_code, 0) << "node is not installed";
  ASSERT_TRUE(fs::exists(npm / "node_modules" / "openai" / "package.json"))
      << "the openai npm package is not installed in " << npm
      << ": run tests/setup/setup-test-deps.sh (or set POLYCHIP_NPM_DIR)";
  ServeProcess s(model, {"--served-model-name", "tiny"});
  ASSERT_TRUE(s.ok());
  auto [status, floats] = s.Post("/v1/embeddings", {{"input", kInputs}});
  ASSERT_EQ(status, 200);
  const std::string cmd =
      "POLYCHIP_NPM_DIR=" + npm.string() + " node " +
      (fs::path(POLYCHIP_SOURCE_DIR) / "tests" / "server" / "embeddings_test.mjs").string() +
      " http://127.0.0.1:" + std::to_string(s.port()) + " " +
      polychip::testing::ShellQuote(json(kInputs).dump());
  const polychip::testing::CommandResult node = RunCommand(cmd);
  ASSERT_EQ(node.exit_code, 0) << node.out << node.err;
  const json got = json::parse(node.out, nullptr, false);
  ASSERT_TRUE(got.is_array()) << node.out;
  ASSERT_EQ(got.size(), kInputs.size());
  const std::vector<Vec> want = Embeddings(floats);
  for (size_t i = 0; i < kInputs.size(); ++i) {
    const Vec v = ToVec(got[i]);
    ASSERT_EQ(v.size(), static_cast<size_t>(kWidth));
    for (int j = 0; j < kWidth; ++j) EXPECT_FLOAT_EQ(v[j], want[i][j]);
  }
}

// llama-embedding's vectors, JSON output, for `inputs` (one per line), pooled by `pooling`.
std::vector<Vec> LlamaCppEmbeddings(const std::string& model,
                                    const std::vector<std::string>& inputs,
                                    const std::string& pooling, std::string* log) {
  std::string prompt;
  for (const std::string& in : inputs) prompt += (prompt.empty() ? "" : "\n") + in;
  const std::string cmd = (LlamaCppDir() / "build" / "bin" / "llama-embedding").string() + " -m " +
                          polychip::testing::ShellQuote(model) + " -t 2 -c 256 --pooling " +
                          pooling + " --embd-normalize 2 --embd-output-format json -p " +
                          polychip::testing::ShellQuote(prompt);
  const polychip::testing::CommandResult r = RunCommand(cmd);
  *log = cmd + "\n" + r.err;
  if (r.exit_code != 0) return {};
  const json j = json::parse(r.out, nullptr, false);
  if (!j.is_object()) return {};
  return Embeddings(j);
}

TEST(Embeddings, AgreeWithLlamaCpp) {
  PC_REQUIRE_SERVE_DEPS(model);
  const fs::path tool = LlamaCppDir() / "build" / "bin" / "llama-embedding";
  ASSERT_TRUE(fs::exists(tool)) << tool << " not found: run tests/setup/fetch-llama-cpp.sh";
  for (const std::string pooling : {"mean", "last"}) {
    ServeProcess s(model, {"--pooling", pooling, "--chunked-prefill-size", "8"});
    ASSERT_TRUE(s.ok());
    auto [status, ours] = s.Post("/v1/embeddings", {{"input", kInputs}});
    ASSERT_EQ(status, 200) << ours.dump();
    std::string log;
    const std::vector<Vec> ref = LlamaCppEmbeddings(model, kInputs, pooling, &log);
    ASSERT_EQ(ref.size(), kInputs.size()) << log;
    const std::vector<Vec> got = Embeddings(ours);
    for (size_t i = 0; i < kInputs.size(); ++i) {
      ASSERT_EQ(ref[i].size(), got[i].size());
      const double cos = Cosine(got[i], ref[i]);
      std::printf("[ agreement ] %s pooling, input %zu: cosine %.6f to llama-embedding\n",
                  pooling.c_str(), i, cos);
      EXPECT_GE(cos, 0.999) << pooling << " input " << i;
    }
  }
}

}  // namespace
}  // namespace polychip::server::testing
