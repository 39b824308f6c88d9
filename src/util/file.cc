#include "util/file.h"

#include <fstream>
#include <iterator>

namespace polychip {

StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read the " + what + " '" + path + "'");
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) return NotFound("cannot read the " + what + " '" + path + "'");
  return text;
}

}  // namespace polychip
