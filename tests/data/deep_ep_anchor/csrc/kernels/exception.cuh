#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

// The three helpers DeepEP's launch macros use, reduced to what compiles.
class EPException : public std::runtime_error {
public:
    EPException(const char* name, const char* file, int line, const std::string& error)
        : std::runtime_error(std::string(name) + " error at " + file + ":" + std::to_string(line) + ": " + error) {}
};

#define CUDA_CHECK(cmd)                                                          \
    do {                                                                         \
        cudaError_t e = (cmd);                                                   \
        if (e != cudaSuccess) throw EPException("CUDA", __FILE__, __LINE__, cudaGetErrorString(e)); \
    } while (0)

#define EP_HOST_ASSERT(cond)                                                     \
    do {                                                                         \
        if (not(cond)) throw EPException("Assertion", __FILE__, __LINE__, #cond); \
    } while (0)
