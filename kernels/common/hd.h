// LCPLAN_HD marks math shared by the CPU reference and the CUDA kernels: the same code runs on both.
#pragma once
#if defined(__CUDACC__)
#define LCPLAN_HD __host__ __device__ __forceinline__
#else
#define LCPLAN_HD inline
#endif
