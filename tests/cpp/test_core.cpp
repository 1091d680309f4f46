// Core helpers: half/bfloat16 conversions and the dtype table.
#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include "core/fp16.h"
#include "core/threads.h"
#include "format/dtype.h"

using namespace strata;

TEST(Fp16, RoundTripsEveryHalf) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = f16_to_f32(uint16_t(h));
        if (std::isnan(f)) continue;
        EXPECT_EQ(f32_to_f16(f), h) << "half bits " << h;
    }
}

TEST(Fp16, RoundsToNearestEven) {
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
    EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
    EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to 65536 rounds to inf
    EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
    EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // exactly half of it: ties to even (zero)
    EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000)), 0x3f80);  // tie, even stays
    EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000)), 0x3f82);  // tie, odd rounds up
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, TableMatchesFormat) {
    EXPECT_EQ(dtype_info(DType::Q4_K).block_bytes, 144);
    EXPECT_EQ(dtype_info(DType::IQ1_M).block_bytes, 56);
    EXPECT_EQ(dtype_info(DType::MXFP4).block_size, 32);
    EXPECT_EQ(dtype_info(int32_t(4)), nullptr);  // Q4_2: removed from ggml
    EXPECT_EQ(dtype_info(int32_t(40)), nullptr);
    EXPECT_EQ(row_bytes(DType::Q6_K, 512), 420u);
    EXPECT_EQ(dtype_from_name("iq2_xxs"), DType::IQ2_XXS);
    EXPECT_FALSE(dtype_from_name("Q9_K").has_value());
}

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/spin_pool.h"
#include "core/threads.h"

// Cores from sysfs: at least one, never more than the hardware threads, and, where sysfs names each CPU's core, the
// count of distinct (package, core) pairs.
TEST(Threads, PhysicalCoresCountDistinctCores) {
    const int cores = physical_cores(), threads = hardware_threads();
    EXPECT_GE(cores, 1);
    EXPECT_LE(cores, threads);
    std::set<std::pair<int, int>> seen;
    for (int c = 0; c < threads; c++) {
        const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        std::ifstream core(dir + "core_id"), pkg(dir + "physical_package_id");
        int a = -1, b = 0;
        if (!(core >> a)) GTEST_SKIP() << "no topology for cpu" << c << " in sysfs";
        pkg >> b;
        seen.insert({b, a});
    }
    EXPECT_EQ(cores, int(seen.size()));
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
    ThreadPool pool(4);
    std::vector<std::atomic<int>> hits(1000);
    for (int rep = 0; rep < 50; rep++) {
        pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; i++) hits[size_t(i)]++;
        });
    }
    for (auto &h : hits) EXPECT_EQ(h.load(), 50);
}

TEST(ThreadPool, PropagatesErrors) {
    for (int spin_us : {0, 2000}) {
        ThreadPool pool(3, spin_us);
        EXPECT_THROW(pool.run([](int ith, int) {
            if (ith == 2) fail("worker %d failed", ith);
        }),
                     Error);
        int sum = 0;
        std::mutex mu;
        pool.run([&](int ith, int) {
            std::lock_guard<std::mutex> lock(mu);
            sum += ith;
        });
        EXPECT_EQ(sum, 0 + 1 + 2) << spin_us;  // the pool still works after an error
    }
}

// Polling workers (spin_us > 0): every thread runs each job once, whether the job comes while they poll (jobs back
// to back), after they went to sleep (a pause longer than the poll), or ends after the caller gave up polling for
// it (a worker's share longer than the poll); nothing is lost between sleeping and waking.
TEST(ThreadPool, PollingThreadsRunEveryJobOnce) {
    ThreadPool pool(3, 200);
    std::vector<std::atomic<int>> ran(3);
    int jobs = 0;
    auto job = [&](int slow_us) {
        pool.run([&](int ith, int nth) {
            EXPECT_EQ(nth, 3);
            if (ith == 1 && slow_us) std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
            ran[size_t(ith)]++;
        });
        jobs++;
        for (auto &r : ran) ASSERT_EQ(r.load(), jobs);  // the job's end waits for every share
    };
    for (int i = 0; i < 2000; i++) job(0);
    for (int i = 0; i < 5; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the workers sleep
        job(0);
        job(1000);  // the caller sleeps before the slow share ends
    }
}

#include <cstdlib>

#include "core/env.h"

// A call runs on the caller and on those of its nth - 1 workers that start before the caller's part is done, each at
// most once, never on the others, and returns after all of those are done (their plain writes seen). Calls of every
// width in turn; the workers spinning between calls (idle_us 2000), asleep (idle_us 0: asleep at once, every call
// has to wake them), or asleep now and then (3 ms between some calls of the third pool). A caller that waits in its
// part for the others to arrive gets all of them.
TEST(SpinPool, RunsACallOnItsThreadsOnly) {
    for (int idle_us : {2000, 0, 1000}) {
        SpinPool pool(4, idle_us);
        ASSERT_EQ(pool.size(), 4);
        for (int rep = 0; rep < 200; rep++) {
            const int nth = 1 + rep % 5, used = std::min(nth, 4);  // 5: more than the pool, clamped to 4
            const bool wait_for_all = rep % 2 == 1;
            std::atomic<int> hits[4] = {0, 0, 0, 0}, arrived{0};
            std::vector<int> wrote(4, 0);  // plain writes by each thread, read after run() returns
            pool.run(nth, [&](int ith, int n) {
                EXPECT_EQ(n, used);
                hits[ith]++;
                arrived++;
                if (ith == 0 && wait_for_all)
                    while (arrived.load() < used) std::this_thread::yield();
                wrote[size_t(ith)] = rep + 1;
            });
            EXPECT_EQ(hits[0].load(), 1);
            for (int i = 0; i < 4; i++) {
                const std::string what = "idle " + std::to_string(idle_us) + " rep " + std::to_string(rep);
                if (i >= used || wait_for_all) {
                    EXPECT_EQ(hits[i].load(), i < used ? 1 : 0) << what;
                }
                EXPECT_LE(hits[i].load(), 1) << what;
                EXPECT_EQ(wrote[size_t(i)], hits[i].load() ? rep + 1 : 0) << what;
            }
            if (idle_us == 1000 && rep % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        }
    }
    SpinPool one(1);
    int calls = 0;
    one.run(3, [&](int ith, int n) { calls += ith == 0 && n == 1; });
    EXPECT_EQ(calls, 1);
}

// A pinned pool: each worker runs on the one logical CPU it was given, the first of a physical core the process may
// use, one core a worker (the constructing thread's core left out, so a pool of every core but one is pinned); with
// fewer such cores than workers none is pinned.
TEST(SpinPool, PinsEachWorkerToACoreOfItsOwn) {
    const std::vector<std::vector<int>> cores = allowed_cores();
    if (cores.size() < 2) GTEST_SKIP() << "fewer than two cores this process may use";
    const int workers = int(cores.size()) - 1;
    SpinPool pool(workers + 1, 2000, true);
    ASSERT_EQ(pool.pinned_cpus().size(), size_t(workers));
    std::set<int> used;
    for (int cpu : pool.pinned_cpus()) {
        const auto core = std::find_if(cores.begin(), cores.end(), [&](const auto &c) { return c[0] == cpu; });
        ASSERT_NE(core, cores.end()) << "cpu " << cpu << " is not the first of an allowed core";
        used.insert(cpu);
    }
    EXPECT_EQ(used.size(), size_t(workers));  // distinct
    std::vector<int> ran_on(size_t(workers + 1), -1);
    for (int rep = 0; rep < 20; rep++)
        pool.run(workers + 1, [&](int ith, int) {
            if (ith > 0) ran_on[size_t(ith)] = sched_getcpu();
        });
    for (int w = 1; w <= workers; w++) {
        if (ran_on[size_t(w)] < 0) continue;  // let off: it had not started when the caller was done
        EXPECT_EQ(ran_on[size_t(w)], pool.pinned_cpus()[size_t(w - 1)]) << "worker " << w;
    }
    // The first pool's cores are its own while it lives. (Another may be pinned where this thread ran when the
    // first pool was made and has since left: the cores left out are the constructing thread's at the time.)
    SpinPool second(workers + 1, 2000, true);
    for (int cpu : second.pinned_cpus()) EXPECT_EQ(used.count(cpu), 0u) << "cpu " << cpu << " given twice";
    SpinPool unpinned(workers + 1, 2000);
    EXPECT_TRUE(unpinned.pinned_cpus().empty());
}

TEST(SpinPool, PinsOnlyWhereThereAreCores) {
    const std::vector<std::vector<int>> cores = allowed_cores();
    if (cores.size() < 2) GTEST_SKIP() << "fewer than two cores this process may use";
    {
        SpinPool too_many(int(cores.size()) + 1, 2000, true);  // a worker more than the other cores
        EXPECT_TRUE(too_many.pinned_cpus().empty());
    }
    {
        SpinPool first(int(cores.size()), 2000, true);
        EXPECT_EQ(first.pinned_cpus().size(), cores.size() - 1);
    }
    SpinPool again(int(cores.size()), 2000, true);  // the first pool gave its cores back
    EXPECT_EQ(again.pinned_cpus().size(), cores.size() - 1);
}

// start() then join(): the workers begin on start() while the caller is elsewhere (here waiting until every worker
// has arrived, which it could not do inside a run() whose part it has not begun), the caller's part runs in
// join(), each thread once, and join() returns with every write seen; calls alternate with run() on one pool.
TEST(SpinPool, StartsWithoutTheCallerAndJoins) {
    SpinPool pool(4, 2000);
    for (int rep = 0; rep < 100; rep++) {
        std::atomic<int> hits[4] = {0, 0, 0, 0}, arrived{0};
        std::vector<int> wrote(4, 0);
        auto fn = [&](int ith, int) {
            hits[ith]++;
            arrived++;
            wrote[size_t(ith)] = rep + 1;
        };
        if (rep % 3 == 2) {
            pool.run(4, fn);
        } else {
            pool.start(4, fn);
            while (arrived.load() < 3) std::this_thread::yield();  // the three workers, without the caller
            EXPECT_EQ(hits[0].load(), 0);
            pool.join();
            for (int i = 0; i < 4; i++) EXPECT_EQ(hits[i].load(), 1) << "rep " << rep << " thread " << i;
        }
        EXPECT_EQ(hits[0].load(), 1);
        for (int i = 0; i < 4; i++) EXPECT_EQ(wrote[size_t(i)], hits[i].load() ? rep + 1 : 0) << rep;
    }
    SpinPool one(1);  // no workers: the whole call in join()
    int calls = 0;
    auto count = [&](int ith, int n) { calls += ith == 0 && n == 1; };
    one.start(2, count);
    EXPECT_EQ(calls, 0);
    one.join();
    EXPECT_EQ(calls, 1);
}

TEST(EnvSwitch, ZeroIsOffOneIsOnElseTheDefault) {
    const char *name = "STRATA_TEST_ENV_SWITCH";
    unsetenv(name);
    EXPECT_TRUE(strata::env_switch(name, true));
    EXPECT_FALSE(strata::env_switch(name, false));
    setenv(name, "0", 1);
    EXPECT_FALSE(strata::env_switch(name, true));
    EXPECT_FALSE(strata::env_switch(name, false));
    setenv(name, "1", 1);
    EXPECT_TRUE(strata::env_switch(name, true));
    EXPECT_TRUE(strata::env_switch(name, false));
    setenv(name, "yes", 1);
    EXPECT_TRUE(strata::env_switch(name, true));
    EXPECT_FALSE(strata::env_switch(name, false));
    unsetenv(name);
}
