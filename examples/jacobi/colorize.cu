// The solution as an RGBA8 image for the preview: v = -u * scale (u <= 0 here), clamped to [0, 1],
// on a dark-blue-to-orange ramp.
extern "C" __global__ void colorize(const float* u, unsigned int* rgba, float scale, unsigned int n)
{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = fminf(fmaxf(-u[i] * scale, 0.0f), 1.0f);
    const unsigned int r = (unsigned int)(255.0f * v);
    const unsigned int g = (unsigned int)(255.0f * v * v * 0.8f);
    const unsigned int b = (unsigned int)(255.0f * (1.0f - v) * 0.5f);
    rgba[i] = r | (g << 8) | (b << 16) | (255u << 24);
}
