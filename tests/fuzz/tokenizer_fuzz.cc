// libFuzzer target: the tokenizer on arbitrary bytes with a real vocabulary (fuzz_vocab.h).
// Input: one byte of options, then the text. Encode must return ids inside the vocabulary;
// decoding those ids, and the input itself read as token ids, must not crash; the stream
// decoder's output must be valid UTF-8 (its contract).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_vocab.h"

namespace {

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polychip::model;
  const Tokenizer& tok = polychip::fuzz::FuzzTokenizer();
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  EncodeOptions eo;
  eo.add_special = flags & 1;
  eo.parse_special = flags & 2;
  const std::vector<TokenId> ids = tok.Encode(text, eo);
  for (TokenId id : ids) {
    if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
  }
  DecodeOptions dopt;
  dopt.remove_special = flags & 4;
  dopt.render_special = flags & 8;
  (void)tok.Decode(ids, dopt);

  // The bytes read as arbitrary token ids (what a client may send to /detokenize or
  // /generate's input_ids, once range-checked).
  std::vector<TokenId> raw(text.size() / sizeof(TokenId));
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * sizeof(TokenId));
  for (TokenId& id : raw) id = static_cast<TokenId>(static_cast<uint32_t>(id) % tok.n_vocab());
  (void)tok.Decode(raw, dopt);
  StreamDecoder stream(tok, flags & 16, flags & 32);
  std::string streamed;
  for (TokenId id : raw) streamed += stream.Push(id);
  streamed += stream.Flush();
  if (!ValidUtf8(streamed)) __builtin_trap();
  return 0;
}
