// `polychip profile` and `polychip bench -o json` on every backend plugin the build produced,
// over the bundled model: the per-op table has rows for the model's ops with the calls a step
// makes, honest times (a number > 0 where the plugin measures them, "-" where it does not), and
// bench's JSON carries the same per-op records.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "common/command.h"

namespace polychip {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

const std::string kPolychip = std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip";
const std::string kBundledModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

struct Row {
  double calls = 0;
  std::string time;  // "-" when the plugin does not time its ops
};

// The rows of each "## <step>" table: step -> op -> row.
std::map<std::string, std::map<std::string, Row>> Tables(const std::string& out) {
  std::map<std::string, std::map<std::string, Row>> tables;
  static const std::regex row(R"(^\| ([a-z_0-9]+) \| ([0-9.e+]+) \| ([-0-9.]+) \|)");
  std::string step;
  size_t begin = 0;
  while (begin < out.size()) {
    size_t end = out.find('\n', begin);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(begin, end - begin);
    begin = end + 1;
    if (line.rfind("## ", 0) == 0) step = line.substr(3, line.find(' ', 3) - 3);
    std::smatch m;
    if (std::regex_search(line, m, row)) tables[step][m[1]] = {std::stod(m[2]), m[3]};
  }
  return tables;
}

// A random rank-4 F16 adapter for the bundled model in the test's temporary directory: its
// path, or "" (and a failure) if `gguf synth` could not write it.
std::string SynthAdapter(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  const CommandResult synth =
      RunCommand(kPolychip + " gguf synth --quiet --lora-for " + ShellQuote(kBundledModel) +
                 " --lora-rank 4 --lora-alpha 8 --type F16 --out " + ShellQuote(path));
  EXPECT_EQ(synth.exit_code, 0) << synth.err;
  return synth.exit_code == 0 ? path : "";
}

class ProfileCliTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProfileCliTest, PrintsPerOpRowsForAPrefillAndADecodeStep) {
  const std::string backend = GetParam();
  const CommandResult r =
      RunCommand(kPolychip + " profile --device " + backend + ":0 --model-path " +
                 ShellQuote(kBundledModel) + " -p 12 -n 3 --membw-mib 16");
  if (r.exit_code != 0 && r.err.find("no per-op counters") != std::string::npos) {
    GTEST_SKIP() << r.err;
  }
  if (r.exit_code != 0 && backend == "vulkan") GTEST_SKIP() << "no Vulkan device: " << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto tables = Tables(r.out);
  ASSERT_TRUE(tables.count("prefill") && tables.count("decode")) << r.out;
  for (const auto& [step, rows] : tables) {
    for (const char* op : {"embedding", "rms_norm", "matmul", "rope", "kv_store", "attention"}) {
      ASSERT_TRUE(rows.count(op)) << step << " has no " << op << " row:\n" << r.out;
      const Row& row = rows.at(op);
      EXPECT_GT(row.calls, 0) << step << " " << op;
      if (row.time != "-") EXPECT_GT(std::stod(row.time), 0) << step << " " << op;
    }
    // One KV store and one attention per layer.
    EXPECT_EQ(rows.at("kv_store").calls, rows.at("attention").calls) << step;
    EXPECT_GE(rows.at("matmul").calls, 4 * rows.at("attention").calls) << step;  // q k v o ...
  }
  if (backend == "cpu") {  // the cpu plugin times every op on the host clock
    EXPECT_NE(tables.at("decode").at("matmul").time, "-") << r.out;
    EXPECT_NE(r.out.find("host read bandwidth"), std::string::npos) << r.out;
  }
}

TEST_P(ProfileCliTest, BenchJsonHasPerOpRecords) {
  const std::string backend = GetParam();
  const CommandResult r =
      RunCommand(kPolychip + " bench -o json -r 1 -p 8 -n 2 --device " + backend +
                 ":0 --model-path " + ShellQuote(kBundledModel));
  if (r.exit_code != 0 && backend == "vulkan") GTEST_SKIP() << "no Vulkan device: " << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto records = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(records.is_array() && records.size() == 2) << r.out;
  for (const auto& rec : records) {
    ASSERT_TRUE(rec.contains("ops_per_step")) << rec.dump();
    if (rec["ops_per_step"].is_null()) GTEST_SKIP() << backend << " has no per-op counters";
    double matmul_calls = 0, attention_calls = 0;
    for (const auto& op : rec["ops_per_step"]) {
      if (op["op"] == "matmul") matmul_calls = op["calls"];
      if (op["op"] == "attention") attention_calls = op["calls"];
    }
    EXPECT_GT(attention_calls, 0) << rec.dump();
    EXPECT_GE(matmul_calls, 4 * attention_calls) << rec.dump();
  }
}

// With --speculative-*, bench adds the engine's generation without and with speculation; the
// draft being the model itself, greedy, every draft is kept (F16 on the cpu plugin gives the same
// logits whatever the step's row count), and the record says so.
TEST_P(ProfileCliTest, BenchReportsSpeculativeAcceptance) {
  if (GetParam() != "cpu") GTEST_SKIP() << "one backend is enough";
  const CommandResult r = RunCommand(
      kPolychip + " bench -o json -r 1 -p 8 -n 24 --device cpu:0 --model-path " +
      ShellQuote(kBundledModel) + " --speculative-draft-model " + ShellQuote(kBundledModel) +
      " --speculative-num-draft-tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto records = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(records.is_array() && records.size() == 4) << r.out;
  EXPECT_EQ(records[2]["test"], "tg24 engine") << r.out;
  EXPECT_FALSE(records[2].contains("spec_acceptance_rate")) << r.out;
  const auto& spec = records[3];
  EXPECT_EQ(spec["test"], "tg24 engine+spec draft k3") << r.out;
  EXPECT_GT(spec["avg_ts"].get<double>(), 0) << r.out;
  EXPECT_GT(spec["spec_draft_tokens"].get<int64_t>(), 0) << r.out;
  EXPECT_EQ(spec["spec_accepted_tokens"], spec["spec_draft_tokens"]) << r.out;
  EXPECT_EQ(spec["spec_acceptance_rate"].get<double>(), 1.0) << r.out;
  EXPECT_GT(spec["spec_accept_length"].get<double>(), 3.0) << r.out;
  // Without an engine to run, depth is refused with the reason.
  const CommandResult d = RunCommand(kPolychip + " bench -d 8 -n 4 --model-path " +
                                     ShellQuote(kBundledModel) +
                                     " --speculative-algorithm ngram");
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.err.find("no -d"), std::string::npos) << d.err;
}

// --lora-vs-base: the test with the adapter and the same test without it, both timed.
TEST_P(ProfileCliTest, BenchLoraVsBaseReportsBothRows) {
  if (GetParam() != "cpu") GTEST_SKIP() << "one backend is enough";
  const std::string adapter = SynthAdapter("bench_lora_vs_base.gguf");
  ASSERT_FALSE(adapter.empty());
  const std::string bench = kPolychip + " bench -o json -r 2 -p 0 -n 6 --device cpu:0 " +
                            "--model-path " + ShellQuote(kBundledModel) + " --lora-vs-base";
  const CommandResult r = RunCommand(bench + " --lora a=" + ShellQuote(adapter));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto records = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(records.is_array() && records.size() == 2) << r.out;
  EXPECT_EQ(records[0]["test"], "tg6") << r.out;
  EXPECT_EQ(records[1]["test"], "tg6 base") << r.out;
  for (const auto& rec : records) {
    EXPECT_GT(rec["avg_ts"].get<double>(), 0) << r.out;
    EXPECT_EQ(rec["samples_ts"].size(), 2u) << r.out;
  }
  // Without an adapter there is nothing to compare.
  const CommandResult none = RunCommand(bench);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("needs --lora"), std::string::npos) << none.err;
}

// profile --lora: the adapter applies to the profiled sequence, its terms a row of their own; a
// file that is no adapter is refused.
TEST_P(ProfileCliTest, ProfileWithLoraHasTheAdaptersRow) {
  if (GetParam() != "cpu") GTEST_SKIP() << "one backend is enough";
  const std::string adapter = SynthAdapter("profile_lora.gguf");
  ASSERT_FALSE(adapter.empty());
  const std::string profile = kPolychip + " profile --device cpu:0 --model-path " +
                              ShellQuote(kBundledModel) + " -p 12 -n 3 --membw-mib 16";
  const CommandResult r = RunCommand(profile + " --lora a=" + ShellQuote(adapter));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("adapter: a="), std::string::npos) << r.out;
  const auto tables = Tables(r.out);
  ASSERT_TRUE(tables.count("decode")) << r.out;
  for (const auto& [step, rows] : tables) {
    ASSERT_TRUE(rows.count("lora")) << step << " has no lora row:\n" << r.out;
    // Every adapted matrix of every layer (q k v o gate up down), and the output.
    EXPECT_GE(rows.at("lora").calls, 7 * rows.at("attention").calls) << step << r.out;
    EXPECT_GT(std::stod(rows.at("lora").time), 0) << step;
  }
  const CommandResult base = RunCommand(profile);
  ASSERT_EQ(base.exit_code, 0) << base.err;
  EXPECT_FALSE(Tables(base.out).at("decode").count("lora")) << base.out;
  const CommandResult bad = RunCommand(profile + " --lora a=" + ShellQuote(kBundledModel));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--lora a="), std::string::npos) << bad.err;
}

INSTANTIATE_TEST_SUITE_P(Backends, ProfileCliTest, ::testing::Values(POLYCHIP_BACKEND_PLUGINS),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace polychip
