// cudapatch: description=Fill a buffer with one value.
// cudapatch: blockSize=256
extern "C" __global__ void fill(float* __restrict__ out, float value, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
