// The particle system of the built-in blocks (Emitter, Forces, Integrate, ToPoints).
//
// All particle state lives in one float4 buffer that flows through the chain and persists across
// frames ("state"), laid out as
//   state[0] header: x magic, y capacity, z frame, w particles spawned this frame   (uint bits)
//   state[1] counts: x, y alive particles in half 0 and half 1, z spawn base, w emit carry (float)
//   half h (h = 0, 1) at 2 + h * 2 * capacity: position+life[capacity], velocity+age[capacity]
// Each frame the particles live in half `cur` (= frame & 1). Integrate appends the survivors into
// the other half through an atomic counter: dead particles are compacted out, and next frame
// starts from that half. Only a header thread touches the counts outside the atomics.

#define CP_MAGIC 0x43505354u  // "CPST"

struct Header { unsigned magic, capacity, frame, spawned; };
struct Counts { unsigned n[2]; unsigned base; float carry; };

__device__ __forceinline__ Header* header(float4* s) { return reinterpret_cast<Header*>(s); }
__device__ __forceinline__ Counts* counts(float4* s) { return reinterpret_cast<Counts*>(s + 1); }
__device__ __forceinline__ const Header* header(const float4* s) { return reinterpret_cast<const Header*>(s); }
__device__ __forceinline__ const Counts* counts(const float4* s) { return reinterpret_cast<const Counts*>(s + 1); }
__device__ __forceinline__ size_t half_base(unsigned h, unsigned capacity) { return 2 + (size_t)h * 2 * capacity; }

__device__ __forceinline__ float hash01(unsigned x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return (x >> 8) * (1.0f / 16777216.0f);
}

// One thread: start the frame. Resets a fresh (or resized) buffer, flips halves, decides how many
// particles to spawn (rate * dt plus the fractional carry, at most what fits).
extern "C" __global__ void particles_begin(float4* state, unsigned capacity, float rate, float dt) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    Header* h = header(state);
    Counts* c = counts(state);
    if (h->magic != CP_MAGIC || h->capacity != capacity) {
        h->magic = CP_MAGIC; h->capacity = capacity; h->frame = 0; h->spawned = 0;
        c->n[0] = 0; c->n[1] = 0; c->base = 0; c->carry = 0.0f;
    }
    unsigned frame = ++h->frame;
    unsigned cur = frame & 1u;
    c->n[cur ^ 1u] = 0;  // the half Integrate appends survivors to this frame
    float want = fmaxf(rate, 0.0f) * fmaxf(dt, 0.0f) + c->carry;
    unsigned spawn = (unsigned)want;
    c->carry = want - (float)spawn;
    unsigned room = capacity - min(c->n[cur], capacity);
    spawn = min(spawn, room);
    c->base = c->n[cur];
    c->n[cur] += spawn;
    h->spawned = spawn;
}

// One thread per possible new particle (grid: MaxPerFrame); thread i < spawned writes slot base + i.
extern "C" __global__ void particles_emit(float4* state, unsigned capacity, unsigned max_per_frame, float3 origin,
                                          float speed, float spread, float lifetime) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const Header* h = header(state);
    if (i >= max_per_frame || i >= h->spawned) return;
    const Counts* c = counts(state);
    unsigned frame = h->frame;
    size_t base = half_base(frame & 1u, capacity);
    unsigned slot = c->base + i;
    unsigned seed = frame * 0x9E3779B9u + i * 0x85EBCA6Bu;
    float u = hash01(seed), v = hash01(seed + 1u), w = hash01(seed + 2u), r = hash01(seed + 3u);
    float z = 1.0f - 2.0f * u * fminf(fmaxf(spread, 0.0f), 1.0f);  // a cone around +y of opening `spread`
    float s = sqrtf(fmaxf(0.0f, 1.0f - z * z));
    float phi = 6.2831853f * v;
    float3 dir = make_float3(s * cosf(phi), z, s * sinf(phi));
    float sp = speed * (0.6f + 0.4f * w);
    state[base + slot] = make_float4(origin.x, origin.y, origin.z, lifetime * (0.5f + 0.5f * r));
    state[base + capacity + slot] = make_float4(dir.x * sp, dir.y * sp, dir.z * sp, 0.0f);
}

// Divergence-free "curl noise" from the curl of a smooth periodic potential.
__device__ float3 curl_field(float3 p, float t) {
    float a = cosf(p.y + 0.7f * t), b = cosf(p.z + 1.1f * t), c = cosf(p.x + 0.9f * t);
    float d = cosf(p.z * 1.3f - 0.5f * t), e = cosf(p.x * 1.7f + 0.3f * t), f = cosf(p.y * 1.5f - 0.8f * t);
    // psi = (sin(y+..) + sin(1.3z-..), sin(z+..) + sin(1.7x+..), sin(x+..) + sin(1.5y-..)); v = curl psi
    return make_float3(1.5f * f - b, 1.3f * d - c, 1.7f * e - a);
}

extern "C" __global__ void particles_forces(float4* /*inout*/ state, unsigned capacity, float3 gravity,
                                            float curl, float curl_scale, float3 attractor, float attraction,
                                            float drag, float dt) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const Header* h = header(state);
    unsigned cur = h->frame & 1u;
    if (i >= capacity || i >= counts(state)->n[cur]) return;
    size_t base = half_base(cur, capacity);
    float4 p = state[base + i];
    float4 v = state[base + capacity + i];
    float t = h->frame * dt;
    float3 q = make_float3(p.x * curl_scale, p.y * curl_scale, p.z * curl_scale);
    float3 n = curl_field(q, t);
    float3 to = make_float3(attractor.x - p.x, attractor.y - p.y, attractor.z - p.z);
    float inv = rsqrtf(to.x * to.x + to.y * to.y + to.z * to.z + 0.05f);
    float k = attraction * inv * inv * inv;
    float damp = fmaxf(0.0f, 1.0f - drag * dt);
    v.x = (v.x + (gravity.x + curl * n.x + k * to.x) * dt) * damp;
    v.y = (v.y + (gravity.y + curl * n.y + k * to.y) * dt) * damp;
    v.z = (v.z + (gravity.z + curl * n.z + k * to.z) * dt) * damp;
    state[base + capacity + i] = v;
}

// Move, age, and append the survivors to the other half (dead particles are compacted out).
extern "C" __global__ void particles_integrate(float4* /*inout*/ state, unsigned capacity, float dt) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const Header* h = header(state);
    unsigned cur = h->frame & 1u;
    Counts* c = counts(state);
    if (i >= capacity || i >= c->n[cur]) return;
    size_t src = half_base(cur, capacity), dst = half_base(cur ^ 1u, capacity);
    float4 p = state[src + i];
    float4 v = state[src + capacity + i];
    v.w += dt;
    if (v.w >= p.w) return;  // age reached lifetime
    p.x += v.x * dt; p.y += v.y * dt; p.z += v.z * dt;
    unsigned slot = atomicAdd(&c->n[cur ^ 1u], 1u);
    state[dst + slot] = p;
    state[dst + capacity + slot] = v;
}

// Positions and colors for drawing: points[i] = (x, y, z, size), points[capacity + i] = rgba.
// Slots past the alive count get size 0, so a draw of all `capacity` points shows only live ones.
extern "C" __global__ void particles_to_points(const float4* state, float4* points, unsigned capacity,
                                               float size, float3 young, float3 old) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= capacity) return;
    const Header* h = header(state);
    unsigned done = (h->frame & 1u) ^ 1u;  // Integrate wrote this frame's survivors there
    if (i >= counts(state)->n[done]) {
        points[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        return;
    }
    size_t base = half_base(done, capacity);
    float4 p = state[base + i];
    float4 v = state[base + capacity + i];
    float a = fminf(v.w / fmaxf(p.w, 1e-6f), 1.0f);
    points[i] = make_float4(p.x, p.y, p.z, size);
    points[capacity + i] = make_float4(young.x + (old.x - young.x) * a, young.y + (old.y - young.y) * a,
                                       young.z + (old.z - young.z) * a, 1.0f - a);
}
