// Reading a whole file, with an error that names it and what it was meant to be.
#pragma once

#include <string>

#include "util/status.h"

namespace polychip {

// The bytes of `path`. `what` names the file in the error ("chat template file"): NotFound
// "cannot read the <what> '<path>'".
StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what);

}  // namespace polychip
