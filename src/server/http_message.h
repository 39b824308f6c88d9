// What a route reads and writes: a parsed request, the response it fills, and the sink a
// streaming response writes through. Plain data, so that the routes know nothing of the HTTP
// library under them (Boost.Beast, inside http_transport.cc only).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace polychip::server {

// Header field names compare without regard to case (RFC 9110 5.1); a name may repeat.
struct HeaderNameLess {
  bool operator()(std::string_view a, std::string_view b) const;
  using is_transparent = void;
};
using HttpHeaders = std::multimap<std::string, std::string, HeaderNameLess>;

// The value of the first field named `name`, "" when there is none.
std::string HeaderValue(const HttpHeaders& headers, std::string_view name);

struct HttpRequest {
  std::string method;   // "GET", "HEAD", "POST", "DELETE", ...
  std::string target;   // as sent: the path and the query string
  std::string path;     // the target's path, percent-decoded: what routes match
  std::string version;  // "HTTP/1.0" or "HTTP/1.1"
  HttpHeaders headers;
  std::string body;  // empty until the transport has read it (the pre-routing hook runs before)

  std::string Header(std::string_view name) const { return HeaderValue(headers, name); }
};

// Where a streaming response's content goes, piece by piece (chunked for an HTTP/1.1 client).
struct StreamSink {
  // Writes one piece; false when the client has gone or stopped reading (stop producing).
  std::function<bool(std::string_view data)> write;
  // Ends the stream (the terminating chunk); the provider is not called again.
  std::function<void()> done;
  // False once the client has closed its connection: a provider with nothing to write yet
  // asks this, so that an abandoned stream is noticed without waiting for its next piece.
  std::function<bool()> is_writable;
};

class HttpResponse {
 public:
  // Called by the transport, after the head is written, until it returns false (the stream
  // failed) or has called sink.done(); it may block waiting for content.
  using StreamProvider = std::function<bool(StreamSink& sink)>;
  // Called once when the response is destroyed, whatever happened to the stream (ended,
  // failed, never started because the request was HEAD or the head could not be written):
  // where a stream frees what it holds. `completed`: the stream reached done().
  using StreamEnd = std::function<void(bool completed)>;

  HttpResponse() = default;
  ~HttpResponse();
  // Moving hands the stream's end over; a copy would run it twice.
  HttpResponse(HttpResponse&& other) noexcept;
  HttpResponse& operator=(HttpResponse&& other) noexcept;
  HttpResponse(const HttpResponse&) = delete;
  HttpResponse& operator=(const HttpResponse&) = delete;

  // Replaces every field named `name` with one.
  void SetHeader(std::string_view name, std::string value);
  std::string Header(std::string_view name) const { return HeaderValue(headers, name); }
  // The whole body at once, with its Content-Type; it replaces a stream set before.
  void SetContent(std::string content, std::string_view content_type);
  // A body produced while it is sent (server-sent events): no Content-Length.
  void SetStream(std::string_view content_type, StreamProvider provider, StreamEnd on_end);

  bool streaming() const { return static_cast<bool>(provider_); }
  const StreamProvider& provider() const { return provider_; }
  // The transport records whether the stream reached its end, for StreamEnd.
  void set_stream_completed(bool completed) { stream_completed_ = completed; }

  int status = 200;
  // Why the transport refused a request (400, 413, 431, 503 ...), for the error handler that
  // gives such an answer its body; not sent.
  std::string reason;
  HttpHeaders headers;
  std::string body;

 private:
  StreamProvider provider_;
  StreamEnd on_end_;
  bool stream_completed_ = false;
};

}  // namespace polychip::server
