// cudapatch: description=Writes the GPU's global nanosecond timer into one slot (profiling timestamps).
// cudapatch: blockSize=1
extern "C" __global__ void stamp(unsigned long long* __restrict__ slots, unsigned int index)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    slots[index] = t;
}
