// CUDA device discovery. Compiled only with STRATA_CUDA; callers guard with STRATA_HAVE_CUDA.
#pragma once

#include <string>
#include <vector>

namespace strata::cuda {

struct DeviceInfo {
    int index = 0;
    std::string name;
    int sm_major = 0, sm_minor = 0;
    size_t total_bytes = 0, free_bytes = 0;
};

// Every visible device; empty (not an error) when there is no GPU or driver.
std::vector<DeviceInfo> list_devices();

// Facts of the current device the kernels' launches ask for, read once per device: 0 where it cannot be read.
enum class DeviceFact { Sms, SmemOptin, CcMajor, Count };
int device_fact(DeviceFact f);

}  // namespace strata::cuda
