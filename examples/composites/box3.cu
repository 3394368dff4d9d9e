// cudapatch: description=A 3-tap box blur (edges repeat the end value), scaled by weight.
// Used twice by smooth.toml; examples/05_composites.py checks it against NumPy.
extern "C" __global__ void box3(const float* in, float* out, float weight, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float left = in[i > 0 ? i - 1 : i];
    float right = in[i + 1 < n ? i + 1 : i];
    out[i] = (left + in[i] + right) * weight;
}
