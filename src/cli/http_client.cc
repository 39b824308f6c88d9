#include "cli/http_client.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace polychip::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(seconds, 0.0) * 1000));
}

// Beast's deadlines (tcp_stream::expires_after) bound asynchronous operations only: each step
// is started asynchronously and the private io_context run until it completes.
void RunToCompletion(asio::io_context& ioc) {
  ioc.run();
  ioc.restart();
}

}  // namespace

HttpReply SendHttp(const HttpCall& call, const std::function<bool(std::string_view)>& on_body) {
  HttpReply reply;
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  const auto fail = [&](const char* step) {
    reply.error = std::string(step) + ": " + ec.message();
    return reply;
  };

  tcp::resolver resolver(ioc);
  const auto endpoints = resolver.resolve(call.host, std::to_string(call.port), ec);
  if (ec) return fail("resolve");
  stream.expires_after(Millis(call.connect_timeout_s));
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
  RunToCompletion(ioc);
  if (ec) return fail("connect");

  http::request<http::string_body> req(http::string_to_verb(call.method), call.target, 11);
  req.set(http::field::host,
          call.port == 80 ? call.host : call.host + ":" + std::to_string(call.port));
  // One request per connection: the server need not keep it open for another.
  req.set(http::field::connection, "close");
  for (const auto& [name, value] : call.headers) req.set(name, value);
  req.body() = call.body;
  req.prepare_payload();
  stream.expires_after(Millis(call.read_timeout_s));
  http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
  RunToCompletion(ioc);
  if (ec) return fail("write");

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());  // a stream has no set length
  stream.expires_after(Millis(call.read_timeout_s));
  http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
  RunToCompletion(ioc);
  if (ec) return fail("read");
  reply.status = parser.get().result_int();
  const bool success = reply.status >= 200 && reply.status < 300;

  // read_some rather than read: read would wait until the piece buffer is full, holding back
  // the events of a slow stream.
  char piece[16 << 10];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    stream.expires_after(Millis(call.read_timeout_s));
    http::async_read_some(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    RunToCompletion(ioc);
    if (ec == http::error::need_buffer) ec = {};  // the piece is full: hand it over, read on
    if (ec) return fail("read");
    const std::string_view got(piece, sizeof piece - parser.get().body().size);
    if (got.empty()) continue;
    if (!success) {
      reply.body.append(got);
    } else if (on_body && !on_body(got)) {
      reply.error = "read: stopped by the receiver";
      return reply;
    }
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return reply;
}

}  // namespace polychip::cli
