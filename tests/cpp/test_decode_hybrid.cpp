// The hybrid split's cost model (strata/decode_hybrid.h SplitModel): the device's line fitted from layers of
// different miss counts, the host's times per count, and the count that makes the slower path quickest. The decode
// mode (strata/decode_mode.h): alone or split, by the time passes take.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "strata/decode_hybrid.h"
#include "strata/decode_mode.h"

using namespace strata;

namespace {

// A device whose part takes d0 + g d microseconds, seen over layers of 0..m misses.
void feed_device(SplitModel &s, double d0, double g, int64_t m, int rounds = 4) {
    for (int r = 0; r < rounds; r++)
        for (int64_t d = 0; d <= m; d++) s.device(d, d0 + g * double(d));
}

}  // namespace

TEST(SplitModel, NothingToTheHostUntilBothSidesAreMeasured) {
    SplitModel s;
    EXPECT_FALSE(s.ready());
    EXPECT_EQ(s.best(8), 0);
    feed_device(s, 20, 35, 8);
    EXPECT_FALSE(s.ready());  // no host figure yet
    s.host(1, 90);
    EXPECT_TRUE(s.ready());
}

TEST(SplitModel, FitsTheDeviceLineThroughItsHits) {
    SplitModel s;
    feed_device(s, 20, 35, 8);
    EXPECT_NEAR(s.g_us(), 35.0, 1e-6);
    EXPECT_NEAR(s.device_us(0), 20.0, 1e-6);
    EXPECT_NEAR(s.device_us(5), 20.0 + 5 * 35.0, 1e-6);
    // the same count every layer: the whole time per miss
    SplitModel t;
    for (int i = 0; i < 10; i++) t.device(3, 120.0);
    EXPECT_NEAR(t.g_us(), 40.0, 1e-6);
}

// The 30B-A3B at 12 GiB, as measured: three misses a layer, 53 us a copy, 190 us for the host's one expert. Moving
// one to the host makes the layer slower (190 > 3 x 53), so it keeps none: rounding m g / (g + c) = 0.65 up gave it
// one and lost a quarter of the decode speed.
TEST(SplitModel, KeepsTheHostOutWhereOneExpertThereIsTheLongerPath) {
    SplitModel s;
    feed_device(s, 10, 53, 3);
    s.host(1, 190);
    s.host(2, 230);
    EXPECT_EQ(s.best(3), 0);
}

// Next-80B at 12 GiB: eight misses, 35 us a copy; the host's pool spreads more experts over more threads, so H grows
// slower than n. The best split is where the two paths cross.
TEST(SplitModel, SplitsWhereThePathsCross) {
    SplitModel s;
    feed_device(s, 10, 35, 8);
    const double h[] = {0, 95, 115, 150, 200, 250, 300, 350, 400};
    for (int n = 1; n <= 8; n++) s.host(n, h[n]);
    // max(10 + 35 (8 - n), H(n)): n = 3 gives max(185, 150) = 185; n = 4 max(150, 200) = 200; n = 2 max(220, 115)
    EXPECT_EQ(s.best(8), 3);
    EXPECT_EQ(s.best(1), 0);  // 95 > 10 + 35
    EXPECT_EQ(s.best(0), 0);
}

// A count the host has not run yet is scaled from the nearest one it has.
TEST(SplitModel, ScalesTheNearestMeasuredHostTime) {
    SplitModel s;
    s.host(2, 100);
    EXPECT_DOUBLE_EQ(s.host_us(2), 100.0);
    EXPECT_DOUBLE_EQ(s.host_us(4), 200.0);
    EXPECT_DOUBLE_EQ(s.host_us(1), 50.0);
    EXPECT_DOUBLE_EQ(s.host_us(0), 0.0);
    s.host(2, 200);  // smoothed a quarter of the way
    EXPECT_DOUBLE_EQ(s.host_us(2), 125.0);
}

namespace {

// n passes of n_tokens, each taking the time its mode takes (us_alone / us_split) from a clock at t; the modes in
// order as a string ('A' / 'S').
std::string drive(DecodeModeChooser &c, int n, double us_alone, double us_split, double &t, int64_t n_tokens = 1) {
    std::string modes;
    for (int i = 0; i < n; i++) {
        const DecodeMode m = c.next(n_tokens, t);
        modes += m == DecodeMode::Alone ? 'A' : 'S';
        t += m == DecodeMode::Alone ? us_alone : us_split;
    }
    return modes;
}

}  // namespace

TEST(DecodeModeChooser, ExploresInRunsThenTakesTheFasterMode) {
    DecodeModeChooser c;
    double t = 0.0;
    // runs of four from the split, until each mode has six samples (a run's first pass after a switch gives none)
    EXPECT_EQ(drive(c, 16, 10000.0, 14000.0, t), "SSSSAAAASSSSAAAA");
    EXPECT_EQ(c.median_us(1, DecodeMode::Alone), 10000.0);
    EXPECT_EQ(c.median_us(1, DecodeMode::Split), 14000.0);
    // then alone, with a probe of the split after 64 passes, the next after 128 (the first left the choice as it was)
    const std::string after = drive(c, 200, 10000.0, 14000.0, t);
    EXPECT_EQ(after.substr(0, 64), std::string(64, 'A'));
    EXPECT_EQ(after.substr(64, 4), "SSSS");
    EXPECT_EQ(after.substr(68, 128), std::string(128, 'A'));
    EXPECT_EQ(after.substr(196, 4), "SSSS");
    EXPECT_EQ(c.stats().alone + c.stats().split, 216u);
    EXPECT_GT(c.stats().alone, 7 * c.stats().split);
    // a winner that stays: probes ever further apart, at most one every k_probe_max passes
    const std::string later = drive(c, 3000, 10000.0, 14000.0, t);
    EXPECT_LE(std::count(later.begin(), later.end(), 'S'), 4 * 6) << later;
}

TEST(DecodeModeChooser, FollowsTheFasterModeWhenTheTimesChange) {
    DecodeModeChooser c;
    double t = 0.0;
    drive(c, 16, 14000.0, 10000.0, t);
    EXPECT_EQ(drive(c, 20, 14000.0, 10000.0, t), std::string(20, 'S'));  // the split is faster
    // now the device alone is: the next probe sees it, and decoding moves over within a window
    const std::string later = drive(c, 160, 8000.0, 10000.0, t);
    const size_t first_alone = later.find("AAAAAAAAAA");
    ASSERT_NE(first_alone, std::string::npos) << later;
    EXPECT_LT(first_alone, 60u) << later;  // at the first probe: judged on its own samples
    EXPECT_EQ(later.substr(later.size() - 10), std::string(10, 'A')) << later;
}

TEST(DecodeModeChooser, GapsOtherPassesAndOtherSizesGiveNoSample) {
    DecodeModeChooser c;
    double t = 0.0;
    c.next(1, t);             // split, the first pass: no sample
    c.next(1, t += 5e6);      // an idle server: the gap is no pass's time
    c.next(1, t += 12000.0);  // a sample of the split: 12 ms
    c.other_pass();           // a prompt started
    c.next(1, t += 1e5);      // the prompt's time is no decode pass's
    EXPECT_EQ(c.median_us(1, DecodeMode::Split), 12000.0);
    c.next(2, t += 9000.0);  // the previous pass was of another size
    c.next(2, t += 9000.0);  // passes of two tokens count for their own size (this one's first: none)
    c.next(2, t += 9000.0);
    EXPECT_EQ(c.median_us(1, DecodeMode::Split), 12000.0);
    EXPECT_EQ(c.median_us(2, DecodeMode::Split), 9000.0);
    EXPECT_EQ(c.median_us(1, DecodeMode::Alone), 0.0);
}

TEST(DecodeModeChooser, MedianShrugsOffAnOutlier) {
    DecodeModeChooser c;
    double t = 0.0;
    drive(c, 16, 10000.0, 12000.0, t);
    // one slow alone pass (a graph recorded, a page fault) among the window: still alone
    c.next(1, t);
    t += 900000.0;
    EXPECT_EQ(drive(c, 10, 10000.0, 12000.0, t), std::string(10, 'A'));
}

TEST(DecodeModeChooser, ExplorationEndsWhereSamplesDoNotCome) {
    // passes of one size interleaved with prompts (no sample ever): after k_explore_max passes the split, as
    // before the chooser, instead of alternating for ever
    DecodeModeChooser c;
    double t = 0.0;
    std::string modes;
    for (int i = 0; i < 100; i++) {
        modes += c.next(1, t += 10000.0) == DecodeMode::Alone ? 'A' : 'S';
        c.other_pass();
    }
    EXPECT_EQ(c.median_us(1, DecodeMode::Alone) + c.median_us(1, DecodeMode::Split), 0.0);
    EXPECT_NE(modes.substr(0, 64).find('A'), std::string::npos) << modes;  // explored
    EXPECT_EQ(modes.substr(64, 36), std::string(36, 'S')) << modes;
}
