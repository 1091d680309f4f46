// The CUDA runtime sees the GPU this test runs on, and reports sane properties.
#include <gtest/gtest.h>

#include "backend/cuda/device.h"

TEST(CudaDevice, ListsAtLeastOneUsableGpu) {
    std::vector<strata::cuda::DeviceInfo> devs = strata::cuda::list_devices();
    ASSERT_FALSE(devs.empty()) << "no CUDA device visible";
    for (const auto &d : devs) {
        EXPECT_FALSE(d.name.empty());
        EXPECT_GE(d.sm_major, 7);
        EXPECT_GT(d.total_bytes, size_t(1) << 30);
        EXPECT_GT(d.free_bytes, 0u);
        EXPECT_LE(d.free_bytes, d.total_bytes);
    }
}
