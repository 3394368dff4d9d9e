// cudapatch: description=Append every element above a threshold to an append buffer (order not kept).
// cudapatch: blockSize=256
// Contract of append kernels: the counter counts every append, even past capacity (so the engine can
// report overflow), but nothing is ever written at or past capacity.
extern "C" __global__ void append_filter(const float* __restrict__ in, float* __restrict__ out,
                                         /*inout*/ unsigned int* __restrict__ counter, float threshold,
                                         unsigned int n, unsigned int capacity)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] > threshold) {
        unsigned int slot = atomicAdd(counter, 1u);
        if (slot < capacity) out[slot] = in[i];
    }
}
