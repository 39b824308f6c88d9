#include "server/http_message.h"

#include <algorithm>
#include <utility>

namespace polychip::server {
namespace {

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

bool HeaderNameLess::operator()(std::string_view a, std::string_view b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                      [](char x, char y) { return Lower(x) < Lower(y); });
}

std::string HeaderValue(const HttpHeaders& headers, std::string_view name) {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

HttpResponse::~HttpResponse() {
  if (on_end_) on_end_(stream_completed_);
}

HttpResponse::HttpResponse(HttpResponse&& other) noexcept
    : status(other.status),
      reason(std::move(other.reason)),
      headers(std::move(other.headers)),
      body(std::move(other.body)),
      provider_(std::move(other.provider_)),
      on_end_(std::exchange(other.on_end_, nullptr)),
      stream_completed_(other.stream_completed_) {}

HttpResponse& HttpResponse::operator=(HttpResponse&& other) noexcept {
  if (this == &other) return *this;
  if (on_end_) on_end_(stream_completed_);
  status = other.status;
  reason = std::move(other.reason);
  headers = std::move(other.headers);
  body = std::move(other.body);
  provider_ = std::move(other.provider_);
  on_end_ = std::exchange(other.on_end_, nullptr);
  stream_completed_ = other.stream_completed_;
  return *this;
}

void HttpResponse::SetHeader(std::string_view name, std::string value) {
  auto [first, last] = headers.equal_range(name);
  headers.erase(first, last);
  headers.emplace(std::string(name), std::move(value));
}

void HttpResponse::SetContent(std::string content, std::string_view content_type) {
  // A whole body replaces a stream set before it (a handler that set a stream and then failed
  // answers its error, not the stream); the stream's end runs now, not completed.
  if (on_end_) std::exchange(on_end_, nullptr)(false);
  provider_ = nullptr;
  body = std::move(content);
  SetHeader("Content-Type", std::string(content_type));
}

void HttpResponse::SetStream(std::string_view content_type, StreamProvider provider,
                             StreamEnd on_end) {
  SetHeader("Content-Type", std::string(content_type));
  provider_ = std::move(provider);
  on_end_ = std::move(on_end);
}

}  // namespace polychip::server
