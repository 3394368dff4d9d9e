// cudapatch: description=Busy-waits for a number of clock cycles, then writes the count (for no-sync tests).
// cudapatch: blockSize=32
extern "C" __global__ void spin(float* __restrict__ out, unsigned long long cycles, unsigned int n)
{
    unsigned long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) { }
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)cycles;
}
