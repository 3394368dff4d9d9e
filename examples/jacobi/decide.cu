// Whether the solve goes on: more[0] = 1 while some cell still moved by more than tol in the last
// half step (|u - half| > tol), else 0. The While region reads more[0] after every iteration.
// One block does the whole reduction (the other blocks of the grid return at once), so nothing has
// to be zeroed between iterations.
extern "C" __global__ void decide(const float* u, const float* half, int* more, float tol, unsigned int n)
{
    if (blockIdx.x != 0) return;
    __shared__ int moved;
    if (threadIdx.x == 0) moved = 0;
    __syncthreads();
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x)
        if (fabsf(u[i] - half[i]) > tol) moved = 1;  // every writer writes 1: no race on the value
    __syncthreads();
    if (threadIdx.x == 0) more[0] = moved;
}
