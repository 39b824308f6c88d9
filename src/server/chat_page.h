// The chat page served at `/` (internal to the server module): one self-contained HTML file
// (its CSS and JS inline, nothing fetched from the network) that talks to the server's own
// /v1/chat/completions with streaming.
#pragma once

#include <string_view>

namespace polychip::server {

std::string_view ChatPageHtml();

}  // namespace polychip::server
