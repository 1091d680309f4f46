// Configure-time probe (cmake/CompilerChecks.cmake): integer dot-product loops of the shapes the quantized kernels
// use, compiled with the project's optimisation and instruction-set flags, checked against the same sums formed one
// term at a time through volatile reads (which no vectorizer can fuse). Exit 0: every loop right; 3: a loop gave a
// wrong sum (the compiler miscompiles it with these flags). GCC 12.2 with AVX-512 VNNI, for one, vectorizes
// sum((nibble - 8) * int8) into unsigned-by-signed byte dot products and loses the -8.
#include <cstdint>
#include <cstdio>

namespace {

constexpr int kBlocks = 64;

struct Block4 {
    uint8_t qs[16];  // two 4-bit levels per byte
    uint32_t qh;     // a fifth bit per level
};

uint8_t w4[kBlocks][16];
uint32_t w5[kBlocks];
int8_t w8[kBlocks][32];
int8_t x8[kBlocks][32];
const int8_t kTable[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline int nibble(const uint8_t *qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }

// The loops under test: one function each, not inlined into main, so the compiler sees them as the kernels do.
#define PROBE_LOOP(name, level)                                   \
    __attribute__((noinline)) int name() {                        \
        int total = 0;                                            \
        for (int i = 0; i < kBlocks; i++) {                       \
            int s = 0;                                            \
            for (int j = 0; j < 32; j++) s += (level) * x8[i][j]; \
            total += s;                                           \
        }                                                         \
        return total;                                             \
    }
PROBE_LOOP(dot_offset4, nibble(w4[i], j) - 8)
PROBE_LOOP(dot_offset5, (nibble(w4[i], j) | int((w5[i] >> j) & 1) << 4) - 16)
PROBE_LOOP(dot_unsigned4, nibble(w4[i], j))
PROBE_LOOP(dot_signed8, int(w8[i][j]))
PROBE_LOOP(dot_table4, int(kTable[nibble(w4[i], j)]))
#undef PROBE_LOOP

__attribute__((noinline)) void dequant_offset4(float *out) {
    for (int i = 0; i < kBlocks; i++)
        for (int j = 0; j < 32; j++) out[i * 32 + j] = 0.5f * float(nibble(w4[i], j) - 8);
}

int slow_sum(int which) {
    int total = 0;
    for (int i = 0; i < kBlocks; i++)
        for (int j = 0; j < 32; j++) {
            volatile int n = nibble(w4[i], j), b5 = int((w5[i] >> j) & 1), w = w8[i][j], x = x8[i][j];
            const int level = which == 0   ? n - 8
                              : which == 1 ? (n | b5 << 4) - 16
                              : which == 2 ? n
                              : which == 3 ? w
                                           : kTable[n];
            total += level * x;
        }
    return total;
}

}  // namespace

int main() {
    uint32_t r = 12345;
    auto next = [&r] { return r = r * 1664525u + 1013904223u, uint8_t(r >> 24); };
    for (int i = 0; i < kBlocks; i++) {
        for (int j = 0; j < 16; j++) w4[i][j] = next();
        w5[i] = uint32_t(next()) | uint32_t(next()) << 8 | uint32_t(next()) << 16 | uint32_t(next()) << 24;
        for (int j = 0; j < 32; j++) w8[i][j] = int8_t(next()), x8[i][j] = int8_t(next() % 255 - 127);
    }
    const int got[5] = {dot_offset4(), dot_offset5(), dot_unsigned4(), dot_signed8(), dot_table4()};
    const char *names[5] = {"(nibble - 8) * int8", "(5-bit level - 16) * int8", "nibble * int8", "int8 * int8",
                            "table[nibble] * int8"};
    int bad = 0;
    for (int k = 0; k < 5; k++) {
        const int want = slow_sum(k);
        if (got[k] != want) std::printf("wrong: sum of %s: %d, expected %d\n", names[k], got[k], want), bad = 1;
    }
    float deq[kBlocks * 32];
    dequant_offset4(deq);
    for (int i = 0; i < kBlocks; i++)
        for (int j = 0; j < 32; j++) {
            volatile int n = nibble(w4[i], j);
            if (deq[i * 32 + j] != 0.5f * float(n - 8)) {
                std::printf("wrong: float(nibble - 8) at %d: %g\n", i * 32 + j, double(deq[i * 32 + j]));
                return 3;
            }
        }
    return bad ? 3 : 0;
}
