// Half of a Jacobi iteration for the Poisson equation  ∇²u = f  on an nx × (n / nx) grid with
// u = 0 on the border: every inner cell becomes the mean of its four neighbours minus h²f/4.
// Rounded operation by operation (__fadd_rn ...): the compiler fuses nothing, so NumPy's float32
// arithmetic reproduces the result bit for bit.
extern "C" __global__ void jacobi_a(const float* u, const float* f, float* half, float h2, unsigned int nx,
                                    unsigned int n)
{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned int x = i % nx, y = i / nx, ny = n / nx;
    if (x == 0 || y == 0 || x == nx - 1 || y == ny - 1) { half[i] = 0.0f; return; }
    const float sum = __fadd_rn(__fadd_rn(u[i - 1], u[i + 1]), __fadd_rn(u[i - nx], u[i + nx]));
    half[i] = __fmul_rn(0.25f, __fsub_rn(sum, __fmul_rn(h2, f[i])));
}
