// The engine's unit tests. Expected strings of the feature cases live in jinja_cases.json and
// were produced by Python's jinja2 configured as transformers configures it; verify_cases.py
// checks them again. The tests below them cover what the reference cannot: error messages
// with lines, the limits, and inputs meant to crash or hang an engine.
#include "jinja/jinja.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace polychip::jinja {
namespace {

// render_reference.py's strftime_now clock.
constexpr std::time_t kNow = 1768471200;

struct Case {
  std::string name;
  std::string template_text;
  nlohmann::ordered_json vars;
  std::optional<std::string> want;  // nullopt: jinja2 raises
  std::string reference_error;
};

std::vector<Case> LoadCases() {
  std::ifstream in(std::string(POLYCHIP_SOURCE_DIR) + "/tests/jinja/jinja_cases.json");
  std::vector<Case> cases;
  if (!in) return cases;
  for (const auto& c : nlohmann::ordered_json::parse(in)) {
    Case k;
    k.name = c["name"];
    k.template_text = c["template"];
    k.vars = c.contains("vars") ? c["vars"] : nlohmann::ordered_json::object();
    if (c.contains("want")) k.want = c["want"].get<std::string>();
    if (c.contains("error")) k.reference_error = c["error"];
    cases.push_back(std::move(k));
  }
  return cases;
}

StatusOr<std::string> RenderText(const std::string& text, const nlohmann::ordered_json& vars,
                                 const RenderOptions& options) {
  auto t = Template::Parse(text, "t");
  if (!t.ok()) return t.status();
  return t->Render(vars, options);
}

StatusOr<std::string> RenderText(const std::string& text, const nlohmann::ordered_json& vars =
                                                              nlohmann::ordered_json::object()) {
  RenderOptions options;
  options.now = kNow;
  return RenderText(text, vars, options);
}

class JinjaCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(JinjaCaseTest, MatchesPythonJinja2) {
  const Case& c = GetParam();
  const auto got = RenderText(c.template_text, c.vars);
  if (c.want) {
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(*got, *c.want);
  } else {
    EXPECT_FALSE(got.ok()) << "jinja2 raises " << c.reference_error << "; we rendered \""
                           << (got.ok() ? *got : "") << "\"";
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, JinjaCaseTest, ::testing::ValuesIn(LoadCases()),
                         [](const auto& info) { return info.param.name; });

TEST(JinjaTest, CasesFileLoads) { EXPECT_GT(LoadCases().size(), 90u); }

TEST(JinjaTest, RuntimeErrorsNameTemplateLineAndCause) {
  auto t = Template::Parse("line one\n{% set x = 1 %}\n{{ x.y.z }}", "chat template");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name(), "chat template");
  auto r = t->Render({});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "chat template line 3: 'int object' has no attribute 'y'");
}

TEST(JinjaTest, RaiseExceptionMessageFollowsTheLine) {
  auto r = RenderText(
      "{% if messages[0].role == 'system' %}\n"
      "{{ raise_exception('System role not supported') }}\n{% endif %}",
      {{"messages", {{{"role", "system"}, {"content", "x"}}}}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "t line 2: System role not supported");
}

TEST(JinjaTest, ErrorsInsideMacrosNameTheMacroLine) {
  auto r = RenderText("{% macro m(x) %}\n{{ x + 1 }}\n{% endmacro %}\n{{ m('a') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "t line 2: can only concatenate str (not \"int\") to str");
}

TEST(JinjaTest, ParseErrorsNameLineAndWhatWasExpected) {
  struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"a\n{% if x %}\nb",
       "t line 3: unexpected end of template, expected 'elif' or 'else' or 'endif'"},
      {"{{ 1 + }}", "t line 1: unexpected 'end of print statement'"},
      {"\n\n{% frobnicate %}", "t line 3: encountered unknown tag 'frobnicate'"},
      {"{{ 'abc }}", "t line 1: unterminated string literal"},
      {"x\n{{ a", "t line 2: unexpected end of template, expected '}}'"},
      {"{% for x in y %}{% endif %}", "t line 1: encountered unknown tag 'endif'"},
      {"{% break %}", "t line 1: 'break' outside of a loop"},
      {"{{ a b }}", "t line 1: expected end of print statement, got 'b'"},
      {"{# open", "t line 1: missing end of comment tag"},
      {"{% set x = 1 %}{{ (1, }}", "t line 1: unexpected '}'"},
  };
  for (const auto& c : cases) {
    auto t = Template::Parse(c.text, "t");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(), c.message) << c.text;
  }
}

TEST(JinjaTest, IntegersBeyondInt64AreAnErrorNotAWrongNumber) {
  // Python's ints are unbounded; ours are 64-bit and say so rather than wrap.
  auto r = RenderText("{{ 2 ** 64 }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("integer overflow"), std::string::npos);
  EXPECT_EQ(*RenderText("{{ 2 ** 62 }}"), "4611686018427387904");
}

TEST(JinjaTest, VariablesKeepKeyOrderAndTypes) {
  auto vars = nlohmann::ordered_json::parse(
      R"({"d": {"z": 1, "a": [1.0, 2, "x", null, true]}, "big": 12345678901234})");
  EXPECT_EQ(*RenderText("{{ d }} {{ big }} {{ d|tojson }}", vars),
            "{'z': 1, 'a': [1.0, 2, 'x', None, True]} 12345678901234 "
            "{\"z\": 1, \"a\": [1.0, 2, \"x\", null, true]}");
  auto r = RenderText("{{ x }}", nlohmann::ordered_json::array());
  EXPECT_FALSE(r.ok());
}

TEST(JinjaTest, UnparsedTemplateRefusesToRender) {
  Template t;
  EXPECT_EQ(t.Render({}).status().code(), StatusCode::kFailedPrecondition);
}

TEST(JinjaTest, TemplatesRenderConcurrently) {
  auto t = Template::Parse("{% for m in messages %}{{ m.content|upper }};{% endfor %}", "t");
  ASSERT_TRUE(t.ok());
  nlohmann::ordered_json vars = {{"messages", {{{"content", "a"}}, {{"content", "b"}}}}};
  std::vector<std::thread> threads;
  std::vector<std::string> outs(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) outs[i] = t->Render(vars).value();
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& o : outs) EXPECT_EQ(o, "A;B;");
}

// ---- limits: nothing a template does may crash or hang the caller ---------------------------

TEST(JinjaLimitsTest, StepsBoundLoops) {
  RenderOptions options;
  options.limits.max_steps = 100'000;
  auto r = RenderText(
      "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}"
      "{% endfor %}{% endfor %}",
      {}, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("steps"), std::string::npos);
}

TEST(JinjaLimitsTest, OutputBytesBoundRendering) {
  RenderOptions options;
  options.limits.max_output_bytes = 1000;
  auto r = RenderText("{% for i in range(100) %}0123456789abcdef{% endfor %}", {}, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  // A value built bigger than the output limit is refused before it is built.
  r = RenderText("{% set s = 'x' * 1000000000000 %}", {}, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  r = RenderText("{% set l = [1] * 1000000000000 %}", {}, options);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaLimitsTest, RecursionIsBounded) {
  auto r = RenderText("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  r = RenderText("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaLimitsTest, DeepNestingInTheSourceIsAParseError) {
  for (const char* open : {"(", "[", "not ", "-", "{'a': "}) {
    std::string text = "{{ ";
    for (int i = 0; i < 5000; ++i) text += open;
    auto t = Template::Parse(text + "1 }}", "t");
    EXPECT_FALSE(t.ok()) << open;
  }
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_FALSE(Template::Parse(blocks, "t").ok());
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " ~ 1";
  EXPECT_FALSE(Template::Parse(chain + " }}", "t").ok());
}

TEST(JinjaLimitsTest, DeepValuesBuiltAtRunTimeAreRefused) {
  // Each iteration nests the list one level deeper: refused before it could overflow the stack
  // of whatever walks it (repr, tojson, the destructor).
  auto r = RenderText(
      "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
      "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  nlohmann::ordered_json deep = 1;
  for (int i = 0; i < 2000; ++i) deep = nlohmann::ordered_json::array({deep});
  EXPECT_FALSE(RenderText("{{ x }}", {{"x", deep}}).ok());
}

TEST(JinjaLimitsTest, SelfReferenceRendersAndIsReleased) {
  // A namespace holding itself: repr stops, and the render frees it (ASan checks the leak).
  auto r = RenderText("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "True");
  r = RenderText("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns|string|length > 0 }}");
  ASSERT_TRUE(r.ok()) << r.status().message();
}

TEST(JinjaLimitsTest, HugeNumbersInNamesAndFormatsAreErrorsOrMisses) {
  EXPECT_FALSE(RenderText("{{ '{99999999999999999999999}'.format(1) }}").ok());
  auto r = RenderText("{{ [{'a': 1}]|map(attribute='99999999999999999999999')|list }}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "[Undefined]");
  EXPECT_FALSE(RenderText("{{ 99999999999999999999999 }}").ok());
  EXPECT_FALSE(RenderText("{{ '%99999999999999999999d' % 1 }}").ok());
  EXPECT_FALSE(RenderText("{{ '{:99999999999999999999}'.format(1) }}").ok());
}

TEST(JinjaLimitsTest, StepsAndRangesNearTheInt64EdgeDoNotOverflow) {
  EXPECT_EQ(
      *RenderText("{{ 'abcdef'[2::9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}"),
      "cc");
  EXPECT_EQ(*RenderText("{{ range(9223372036854775800, 9223372036854775807, 5)|list }}"),
            "[9223372036854775800, 9223372036854775805]");
  EXPECT_EQ(*RenderText("{{ range(-9223372036854775807, 9223372036854775807, "
                        "4611686018427387904)|list|length }}"),
            "4");
  EXPECT_FALSE(RenderText("{{ '%d' % 1e300 }}").ok());  // Python's ints are unbounded, ours not
}

TEST(JinjaLimitsTest, SourceSizeIsBounded) {
  EXPECT_FALSE(Template::Parse(std::string(Limits{}.max_source_bytes + 1, 'x'), "t").ok());
}

}  // namespace
}  // namespace polychip::jinja
