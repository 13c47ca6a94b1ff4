#pragma once

#define NUM_MAX_NVL_PEERS 8

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#ifndef DISABLE_SM90_FEATURES
#include <cuda_fp8.h>
#else
// Ampere does not support FP8 features
#define __NV_E4M3 0
#define __NV_E5M2 1
typedef int __nv_fp8_interpretation_t;
typedef int __nv_fp8x4_e4m3;
typedef uint8_t __nv_fp8_storage_t;
#endif

namespace deep_ep {
typedef int64_t topk_idx_t;
}  // namespace deep_ep
