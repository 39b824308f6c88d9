"""Byte-level BPE (GPT-2 style) trained on our corpus.

The pre-tokenizer regex and the byte-to-unicode table are GPT-2's, which is what
llama.cpp applies for tokenizer.ggml.model=gpt2 / tokenizer.ggml.pre=gpt-2, so a GGUF
carrying our tokens and merges tokenizes identically in llama.cpp.
"""
import json

import regex

# GPT-2 pre-tokenization pattern (llama.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2).
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_UNI = bytes_to_unicode()


def train(text, vocab_size, log=print):
    """Learns merges so that 256 bytes + merges + specials == vocab_size."""
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    counts = {}
    for piece in GPT2_PATTERN.findall(text):
        counts[piece] = counts.get(piece, 0) + 1
    # Sorted for a deterministic order independent of dict/hash details.
    words = [list(p.encode("utf-8")) for p in sorted(counts)]
    freqs = [counts[p] for p in sorted(counts)]

    pair_counts = {}
    where = {}
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_counts[(a, b)] = pair_counts.get((a, b), 0) + freqs[wi]
            where.setdefault((a, b), set()).add(wi)

    token_bytes = [bytes([b]) for b in range(256)]
    merges = []  # list of (id_a, id_b)
    for step in range(n_merges):
        if not pair_counts:
            break
        # Highest count wins; ties broken by the smaller pair, deterministically.
        best = max(pair_counts.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))[0]
        new_id = len(token_bytes)
        token_bytes.append(token_bytes[best[0]] + token_bytes[best[1]])
        merges.append(best)
        for wi in sorted(where.pop(best, ())):
            w, f = words[wi], freqs[wi]
            for a, b in zip(w, w[1:]):
                pair_counts[(a, b)] -= f
                if pair_counts[(a, b)] == 0:
                    del pair_counts[(a, b)]
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):
                pair_counts[(a, b)] = pair_counts.get((a, b), 0) + f
                where.setdefault((a, b), set()).add(wi)
        pair_counts.pop(best, None)
        if step % 500 == 0:
            log(f"bpe merge {step}/{n_merges}: {token_bytes[new_id]!r}")
    return Tokenizer(merges)


class Tokenizer:
    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.token_bytes = [bytes([b]) for b in range(256)]
        self.merge_to_id = {}
        for a, b in self.merges:
            self.merge_to_id[(a, b)] = len(self.token_bytes)
            self.token_bytes.append(self.token_bytes[a] + self.token_bytes[b])
        self.special = {s: len(self.token_bytes) + i for i, s in enumerate(SPECIAL_TOKENS)}
        self.cache = {}

    @property
    def vocab_size(self):
        return len(self.token_bytes) + len(self.special)

    def token_text(self, i):
        """Token string as stored in GGUF (GPT-2 byte-to-unicode form)."""
        if i >= len(self.token_bytes):
            return SPECIAL_TOKENS[i - len(self.token_bytes)]
        return "".join(BYTE_TO_UNI[b] for b in self.token_bytes[i])

    def merge_strings(self):
        return [self.token_text(a) + " " + self.token_text(b) for a, b in self.merges]

    def _encode_piece(self, piece):
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        ids = list(piece.encode("utf-8"))
        while len(ids) > 1:
            # Apply the lowest-rank merge, all its occurrences left to right.
            best = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, 1 << 30))
            if best not in self.ranks:
                break
            new_id, out, i = self.merge_to_id[best], [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        self.cache[piece] = ids
        return ids

    def encode(self, text):
        """Plain text (no special-token parsing) to ids."""
        out = []
        for piece in GPT2_PATTERN.findall(text):
            out.extend(self._encode_piece(piece))
        return out

    def decode(self, ids):
        data = b"".join(self.token_bytes[i] if i < len(self.token_bytes)
                        else SPECIAL_TOKENS[i - len(self.token_bytes)].encode() for i in ids)
        return data.decode("utf-8", errors="replace")

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"merges": self.merges}, f)

    @staticmethod
    def load(path):
        with open(path) as f:
            return Tokenizer(json.load(f)["merges"])
