// CUDA kernel of the example plugin: out[i] = in[i] * scale, for float and half tensors.
// Kept apart from the TensorRT glue so it compiles (and is tested) without TensorRT's headers.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "scale_kernel.h"

namespace {

template <typename T>
__global__ void scaleKernel(T const* in, T* out, float scale, long long count) {
    long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) {
        out[i] = static_cast<T>(static_cast<float>(in[i]) * scale);
    }
}

}  // namespace

extern "C" int forgeLaunchScale(void const* in, void* out, float scale, long long count, int isHalf, cudaStream_t stream) {
    if (count <= 0) {
        return 0;
    }
    int const threads = 256;
    unsigned int const blocks = static_cast<unsigned int>((count + threads - 1) / threads);
    if (isHalf) {
        scaleKernel<__half><<<blocks, threads, 0, stream>>>(static_cast<__half const*>(in), static_cast<__half*>(out), scale, count);
    } else {
        scaleKernel<float><<<blocks, threads, 0, stream>>>(static_cast<float const*>(in), static_cast<float*>(out), scale, count);
    }
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
