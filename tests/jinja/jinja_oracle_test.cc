// The "must show": every chat template in llama.cpp's models/templates rendered by our
// engine byte for byte as Python's jinja2 renders it with transformers' settings, on the
// conversations of conversations.json (plain, system, multi-turn, tools, tool calls and
// results, earlier reasoning, non-ASCII and escapes; with and without the generation prompt).
// Where jinja2 raises, we must return an error. render_reference.py is the Python side.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/command.h"
#include "jinja/jinja.h"

namespace polychip::jinja {
namespace {

namespace fs = std::filesystem;
using polychip::testing::LlamaCppDir;
using polychip::testing::ReadFile;
using polychip::testing::RunCommand;
using polychip::testing::ShellQuote;
using polychip::testing::Stderr;

TEST(JinjaOracleTest, LlamaCppTemplatesMatchPythonJinja2) {
  const fs::path templates = LlamaCppDir() / "models" / "templates";
  if (!fs::is_directory(templates)) {
    GTEST_SKIP() << templates << " is missing (tests/setup/setup-test-deps.sh fetches it)";
  }
  if (RunCommand("python3 -c 'import jinja2'", Stderr::kDiscarded).exit_code != 0) {
    GTEST_SKIP() << "python3 with jinja2 is not installed (Debian: python3-jinja2)";
  }
  const fs::path dir = fs::path(POLYCHIP_SOURCE_DIR) / "tests" / "jinja";
  const auto ref = RunCommand("python3 " + ShellQuote((dir / "render_reference.py").string()) +
                              " " + ShellQuote(templates.string()) + " " +
                              ShellQuote((dir / "conversations.json").string()));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const auto reference = nlohmann::ordered_json::parse(ref.out);
  const auto& cases = reference["cases"];

  std::map<std::string, StatusOr<Template>> parsed;
  int matched = 0, total = 0;
  std::set<std::string> mismatched_templates;
  for (const auto& r : reference["results"]) {
    const std::string name = r["template"];
    auto it = parsed.find(name);
    if (it == parsed.end()) {
      it = parsed.emplace(name, Template::Parse(ReadFile(templates / name), name)).first;
    }
    const auto& c = cases[r["case"].get<size_t>()];
    RenderOptions options;
    options.now = reference["now"].get<std::time_t>();
    StatusOr<std::string> ours =
        it->second.ok() ? it->second->Render(c["vars"], options) : it->second.status();
    ++total;
    bool same;
    std::string why;
    if (r.contains("error")) {
      same = !ours.ok();
      why = "jinja2 raised (" + r["error"].get<std::string>() + "), we rendered";
    } else if (!ours.ok()) {
      same = false;
      why = "we failed: " + ours.status().message();
    } else {
      const std::string& want = r["out"].get_ref<const std::string&>();
      same = *ours == want;
      if (!same) {
        size_t i = 0;
        while (i < want.size() && i < ours->size() && want[i] == (*ours)[i]) ++i;
        why = "output differs at byte " + std::to_string(i) + ": want \"" + want.substr(i, 60) +
              "\", got \"" + ours->substr(i, 60) + "\"";
      }
    }
    if (same) {
      ++matched;
    } else {
      mismatched_templates.insert(name);
      ADD_FAILURE() << name << " [" << c["name"].get<std::string>() << "]: " << why;
    }
  }
  std::printf("jinja oracle: %d/%d renders match Python jinja2 (%zu templates, %zu cases)\n",
              matched, total, parsed.size(), cases.size());
  EXPECT_GT(total, 0);
  EXPECT_EQ(matched, total);
}

}  // namespace
}  // namespace polychip::jinja
