#include <cuda_runtime.h>

namespace deep_ep {

int get_local_device_id() {
    int device = 0;
    cudaGetDevice(&device);
    return device;
}

bool is_sm90_compiled() {
#ifndef DISABLE_SM90_FEATURES
    return true;
#else
    return false;
#endif
}

}  // namespace deep_ep
