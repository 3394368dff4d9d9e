// out[i] = amplitude * sin(2 pi frequency i / n + phase)
extern "C" __global__ void wave(float* out, float amplitude, float frequency, float phase, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = amplitude * sinf(6.2831853f * frequency * (float)i / (float)n + phase);
}
