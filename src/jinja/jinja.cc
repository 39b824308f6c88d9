#include "jinja/jinja.h"

#include "jinja/ast.h"
#include "jinja/eval.h"
#include "jinja/lexer.h"

namespace polychip::jinja {

StatusOr<Template> Template::Parse(std::string_view source, std::string name) {
  const Limits limits;
  if (source.size() > limits.max_source_bytes) {
    return InvalidArgument(name + ": template larger than " +
                           std::to_string(limits.max_source_bytes) + " bytes");
  }
  PC_ASSIGN_OR_RETURN(auto tokens, internal::Tokenize(source, name));
  PC_ASSIGN_OR_RETURN(auto program,
                      internal::ParseProgram(std::move(tokens), std::move(name), limits.max_depth));
  Template t;
  t.program_ = std::move(program);
  return t;
}

StatusOr<std::string> Template::Render(const nlohmann::ordered_json& variables,
                                       const RenderOptions& options) const {
  if (!program_) return FailedPrecondition("template not parsed");
  internal::Renderer renderer(*program_, options);
  return renderer.Render(variables);
}

const std::string& Template::name() const {
  static const std::string kEmpty;
  return program_ ? program_->name : kEmpty;
}

}  // namespace polychip::jinja
