#include "configs.cuh"
#include "launch.cuh"

namespace deep_ep {
namespace intranode {

template <int kNumThreads>
__global__ void tag_kernel(int* out, int value) {
#ifndef DISABLE_SM90_FEATURES
    if (threadIdx.x == 0) out[blockIdx.x] = value + 90;  // the Hopper path
#else
    if (threadIdx.x == 0) out[blockIdx.x] = value + 80;  // the Ampere fallback
#endif
}

void dispatch(int* out, int num_sms, cudaStream_t stream) {
    constexpr int kNumThreads = 768;
    constexpr int kNumTMABytesPerWarp = 8192;
#ifndef DISABLE_SM90_FEATURES
    constexpr int smem_size = kNumTMABytesPerWarp * (kNumThreads / 32);
#endif

    SETUP_LAUNCH_CONFIG(num_sms, kNumThreads, stream);
    auto kernel = tag_kernel<kNumThreads>;
    SET_SHARED_MEMORY_FOR_TMA(kernel);
    LAUNCH_KERNEL(&cfg, kernel, out, 1);
}

void combine(int* out, int num_sms, cudaStream_t stream) {
    constexpr int kNumThreads = 768;
    constexpr int kNumTMABytesPerWarp = 4096;
#ifndef DISABLE_SM90_FEATURES
    constexpr int smem_size = kNumTMABytesPerWarp * (kNumThreads / 32);
#endif

    SETUP_LAUNCH_CONFIG(num_sms, kNumThreads, stream);
    auto kernel = tag_kernel<kNumThreads>;
    SET_SHARED_MEMORY_FOR_TMA(kernel);
    LAUNCH_KERNEL(&cfg, kernel, out, 2);
}

}  // namespace intranode
}  // namespace deep_ep
