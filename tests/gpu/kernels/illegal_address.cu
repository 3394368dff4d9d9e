// Harmless until a Hot edit sets `trigger`: then thread 0 stores to address 8 (an illegal address).
// The planted fault of the fault tests, the isolated engine's benchmark and its GL probe.
extern "C" __global__ void k(const float* in, float* out, float trigger, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
    if (trigger > 0.5f && i == 0) *((volatile float*)(size_t)8) = 1.0f;   // an illegal address
}
