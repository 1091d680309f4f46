// UTF-8 validation and the GPT-2 byte-level alphabet. Well-formedness follows Table 3-7 of the Unicode standard
// (no overlongs, no surrogates, nothing past U+10FFFF), which is also what Rust strings and PCRE2 accept.
#include "tokenizer/utf8.h"

#include <array>

namespace strata::tok {

namespace {

enum class Scan { ok, invalid, truncated };

// Classifies the bytes at s[pos]: ok with n = sequence length; invalid with n = the maximal ill-formed subpart
// (>= 1 byte); truncated with n = the bytes left, all a valid start that the end of s cut short.
Scan scan(std::string_view s, size_t pos, size_t &n) {
    const auto b0 = uint8_t(s[pos]);
    if (b0 < 0x80) {
        n = 1;
        return Scan::ok;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;  // overlong
        if (b0 == 0xED) hi = 0x9F;  // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;  // overlong
        if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
        n = 1;
        return Scan::invalid;
    }
    for (size_t k = 1; k < len; k++) {
        if (pos + k >= s.size()) {
            n = k;
            return Scan::truncated;
        }
        const auto b = uint8_t(s[pos + k]);
        const bool good = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!good) {
            n = k;
            return Scan::invalid;
        }
    }
    n = len;
    return Scan::ok;
}

struct ByteLevelTables {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 324> to_byte{};  // code points 0..323 cover the whole alphabet

    ByteLevelTables() {
        to_byte.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; b++) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            to_cp[b] = printable ? uint32_t(b) : next++;
            to_byte[to_cp[b]] = int16_t(b);
        }
    }
};

const ByteLevelTables &byte_level_tables() {
    static const ByteLevelTables t;
    return t;
}

}  // namespace

size_t utf8_seq_len(std::string_view s, size_t pos) {
    size_t n;
    return scan(s, pos, n) == Scan::ok ? n : 0;
}

uint32_t utf8_decode(std::string_view s, size_t pos, size_t n) {
    const auto b = [&](size_t k) { return uint32_t(uint8_t(s[pos + k])); };
    switch (n) {
        case 1:
            return b(0);
        case 2:
            return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
        case 3:
            return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
        default:
            return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    }
}

void utf8_append(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | cp >> 6);
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | cp >> 12);
        out += char(0x80 | (cp >> 6 & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | cp >> 18);
        out += char(0x80 | (cp >> 12 & 0x3F));
        out += char(0x80 | (cp >> 6 & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

size_t utf8_first_invalid(std::string_view s) {
    size_t pos = 0, n;
    while (pos < s.size()) {
        if (uint8_t(s[pos]) < 0x80) {
            pos++;
            continue;
        }
        if (scan(s, pos, n) != Scan::ok) return pos;
        pos += n;
    }
    return s.size();
}

size_t utf8_incomplete_tail(std::string_view s) {
    // A sequence is at most 4 bytes, so only a lead byte among the last 3 can start an unfinished one.
    const size_t from = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t pos = s.size(); pos-- > from;) {
        const auto b = uint8_t(s[pos]);
        if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking for its lead
        size_t n;
        return scan(s, pos, n) == Scan::truncated ? s.size() - pos : 0;
    }
    return 0;
}

void utf8_append_sanitized(std::string &out, std::string_view s) {
    size_t pos = 0, n;
    while (pos < s.size()) {
        size_t run = pos;
        while (run < s.size() && uint8_t(s[run]) < 0x80) run++;
        out.append(s.data() + pos, run - pos);
        pos = run;
        if (pos == s.size()) break;
        if (scan(s, pos, n) == Scan::ok) {
            out.append(s.data() + pos, n);
        } else {
            out += "\xEF\xBF\xBD";
        }
        pos += n;
    }
}

uint32_t byte_to_codepoint(uint8_t b) {
    return byte_level_tables().to_cp[b];
}

int codepoint_to_byte(uint32_t cp) {
    const auto &t = byte_level_tables();
    return cp < t.to_byte.size() ? t.to_byte[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view raw) {
    std::string out;
    out.reserve(raw.size() * 2);
    for (char c : raw) utf8_append(out, byte_to_codepoint(uint8_t(c)));
    return out;
}

bool byte_level_to_bytes(std::string_view s, std::string &out) {
    out.clear();
    size_t pos = 0;
    while (pos < s.size()) {
        const size_t n = utf8_seq_len(s, pos);
        if (n == 0) return false;
        const int b = codepoint_to_byte(utf8_decode(s, pos, n));
        if (b < 0) return false;
        out += char(b);
        pos += n;
    }
    return true;
}

}  // namespace strata::tok
