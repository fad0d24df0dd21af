#pragma once
#include <cuda_runtime.h>

// Launches out = in * scale over `count` elements (half when isHalf != 0, else float); 0 on success.
extern "C" int forgeLaunchScale(void const* in, void* out, float scale, long long count, int isHalf, cudaStream_t stream);
