// The other half of a Jacobi iteration: from the half step back into u, in place (u is inout: the
// loop reads it again next iteration). Same arithmetic as jacobi_a.cu.
extern "C" __global__ void jacobi_b(const float* half, const float* f, /*inout*/ float* u, float h2, unsigned int nx,
                                    unsigned int n)
{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned int x = i % nx, y = i / nx, ny = n / nx;
    if (x == 0 || y == 0 || x == nx - 1 || y == ny - 1) { u[i] = 0.0f; return; }
    const float sum = __fadd_rn(__fadd_rn(half[i - 1], half[i + 1]), __fadd_rn(half[i - nx], half[i + nx]));
    u[i] = __fmul_rn(0.25f, __fsub_rn(sum, __fmul_rn(h2, f[i])));
}
