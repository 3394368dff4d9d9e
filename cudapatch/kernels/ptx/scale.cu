// cudapatch: description=Multiply every element by a scalar: out[i] = in[i] * factor + offset.
// cudapatch: blockSize=256
extern "C" __global__ void scale(const float* __restrict__ in, float* __restrict__ out, float factor,
                                 float offset, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor + offset;
}
