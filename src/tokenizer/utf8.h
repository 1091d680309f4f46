// UTF-8 helpers the tokenizers share: sequence validation, and GPT-2's byte-level alphabet (each byte shown as
// one printable code point). No Unicode properties here: those come from PCRE2 in the pre-tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tok {

// Length of the well-formed UTF-8 sequence at s[pos] (1..4), or 0 when the bytes there are not one (a stray
// continuation byte, an overlong form, a surrogate, > U+10FFFF, or a sequence cut short by the end of s).
size_t utf8_seq_len(std::string_view s, size_t pos);

// Decodes the well-formed sequence of length n (from utf8_seq_len) at s[pos].
uint32_t utf8_decode(std::string_view s, size_t pos, size_t n);

// Appends the UTF-8 encoding of code point cp (< 0x110000, not a surrogate).
void utf8_append(std::string &out, uint32_t cp);

// Offset of the first byte that is not part of well-formed UTF-8, or s.size() when all of s is.
size_t utf8_first_invalid(std::string_view s);

// Number of bytes at the end of s that are the start of a sequence that could still be completed by more bytes
// (0..3). A decoder that streams holds these back instead of printing half a character.
size_t utf8_incomplete_tail(std::string_view s);

// Appends s to out with every ill-formed part replaced by U+FFFD (one per maximal ill-formed subpart, as the
// Unicode standard recommends), so what comes out is always valid UTF-8.
void utf8_append_sanitized(std::string &out, std::string_view s);

// GPT-2 byte-level alphabet: byte b <-> one code point. Printable Latin-1 bytes map to themselves; the other 68
// (controls, space, 0x7F-0xA0, soft hyphen) map to U+0100 upwards in byte order.
uint32_t byte_to_codepoint(uint8_t b);
// The byte a code point of the alphabet stands for, or -1 when cp is not in it.
int codepoint_to_byte(uint32_t cp);

// Raw bytes -> byte-level text (each byte becomes the UTF-8 of its code point).
std::string bytes_to_byte_level(std::string_view raw);
// Byte-level text -> raw bytes. Returns false (out unspecified) when s holds a character outside the alphabet.
bool byte_level_to_bytes(std::string_view s, std::string &out);

}  // namespace strata::tok
