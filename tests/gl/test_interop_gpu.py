"""CUDA–GL sharing on the GPU machine (EGL on the NVIDIA driver): round trips against NumPy,
one-call mapping, lifecycles, engine-driven outputs and the headless preview."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Block, like
from cudapatch.errors import InteropError

pytestmark = [pytest.mark.gpu, pytest.mark.gl]  # gl_engine (conftest): 640 x 360


def _cupy_view(ptr, nbytes, dtype, owner):
    import cupy

    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner)
    return cupy.ndarray((nbytes // np.dtype(dtype).itemsize,), dtype, cupy.cuda.MemoryPointer(mem, 0))


def _gl_reads(name, nbytes, dtype=np.float32):
    """What GL's GPU reads of buffer ``name`` see (what a draw reads): a copy GL makes on the GPU into
    a buffer of its own, read back. (glGetBufferSubData on an imported buffer returns the bytes of
    its first call on driver 580: a host-side cache GL is not told to drop.)"""
    from OpenGL import GL

    tmp = GL.glGenBuffers(1)
    GL.glBindBuffer(GL.GL_COPY_READ_BUFFER, name)
    GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, tmp)
    GL.glBufferData(GL.GL_COPY_WRITE_BUFFER, nbytes, None, GL.GL_STREAM_READ)
    GL.glCopyBufferSubData(GL.GL_COPY_READ_BUFFER, GL.GL_COPY_WRITE_BUFFER, 0, 0, nbytes)
    got = np.frombuffer(GL.glGetBufferSubData(GL.GL_COPY_WRITE_BUFFER, 0, nbytes), dtype)
    GL.glDeleteBuffers(1, [tmp])
    return got


def test_buffer_round_trips_both_ways(gl_engine):
    from OpenGL import GL

    from cudapatch.interop import SharedBuffer

    engine, _ = gl_engine
    rng = np.random.default_rng()
    n = 10_000
    with SharedBuffer.create(n * 4) as buf:
        want = rng.standard_normal(n).astype(np.float32)
        with buf.map(stream=engine.device.stream) as m:  # CUDA writes, GL reads
            m.as_array("float32").set(want)
        engine.synchronize()
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buf.gl_name)
        got = np.frombuffer(GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, n * 4), np.float32)
        assert np.array_equal(got, want)
        want2 = rng.standard_normal(n).astype(np.float32)  # GL writes, CUDA reads
        GL.glBufferSubData(GL.GL_ARRAY_BUFFER, 0, n * 4, want2)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
        with buf.map(stream=engine.device.stream) as m:
            assert np.array_equal(m.as_array("float32").get(), want2)


def test_texture_round_trip_and_wrong_format(gl_engine):
    import cupy
    from OpenGL import GL

    from cudapatch.interop import SharedTexture2D

    engine, _ = gl_engine
    rng = np.random.default_rng()
    w, h = 123, 77
    img = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    dev = cupy.asarray(img)
    cupy.cuda.get_current_stream().synchronize()  # the engine stream does not wait for CuPy's
    with SharedTexture2D.create(w, h, format="rgba8") as tex:
        with tex.map(stream=engine.device.stream) as m:
            m.copy_from(dev.data.ptr)
        engine.synchronize()
        GL.glBindTexture(GL.GL_TEXTURE_2D, tex.gl_name)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        got = np.frombuffer(GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE), np.uint8)
        assert np.array_equal(got.reshape(h, w, 4), img)
    name = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_2D, name)
    GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGB8, 4, 4, 0, GL.GL_RGB, GL.GL_UNSIGNED_BYTE, None)
    with pytest.raises(InteropError, match=f"GL texture {name}.*internal format"):
        SharedTexture2D.from_gl_texture(name)
    with pytest.raises(InteropError, match="not a GL buffer"):
        from cudapatch.interop import SharedBuffer

        SharedBuffer.from_gl_buffer(name + 1000)
    GL.glDeleteTextures(1, [name])


def test_group_maps_everything_in_one_call_and_lifecycle(gl_engine, monkeypatch):
    from cudapatch.interop import ResourceGroup, SharedBuffer, SharedTexture2D
    from cudapatch.kernels import _driver

    engine, _ = gl_engine
    s = engine.device.stream
    a, b = SharedBuffer.create(1024, label="a"), SharedBuffer.create(4096, label="b")
    t = SharedTexture2D.create(16, 16, format="rgba32f", label="t")
    group = ResourceGroup([a, b, t])
    d = _driver.driver()
    calls = []
    real_map = d.cuGraphicsMapResources
    monkeypatch.setattr(d, "cuGraphicsMapResources", lambda *args: calls.append(args[0]) or real_map(*args))
    with group.map(stream=s):
        assert a.is_mapped and b.is_mapped and t.is_mapped
        assert group.pointer(a) != group.pointer(b)
        with pytest.raises(InteropError, match="already mapped"):
            a.map(stream=s)
    assert calls == [3]  # one driver call for three resources
    assert not (a.is_mapped or b.is_mapped or t.is_mapped)
    with pytest.raises(InteropError, match="not mapped"):
        group.unmap()
    with pytest.raises(RuntimeError):  # an exception inside the block still unmaps
        with a.map(stream=s):
            raise RuntimeError("boom")
    assert not a.is_mapped
    for r in (a, b, t):
        r.close()
        r.close()
        assert r.is_closed
    with pytest.raises(InteropError, match=r"map: a \(GL buffer \d+\) is closed"):
        a.map(stream=s)
    with pytest.raises(InteropError, match="closed"):
        _ = t.handle


@pytest.mark.parametrize("flags", ["write_discard", "surface_ldst"], ids=["array-copy", "surface-stores"])
def test_engine_writes_a_texture_every_frame(gl_engine, flags):
    from OpenGL import GL

    from cudapatch.blocks.library import CustomKernel
    from cudapatch.interop import GlBridge, SharedTexture2D

    engine, _ = gl_engine
    code = """
extern "C" __global__ void gradient(unsigned int* image, unsigned int level, unsigned int count) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) image[i] = (i % 256u) | ((level & 255u) << 8) | (0xFFu << 24);
}"""
    w, h = 64, 32
    block = engine.add(CustomKernel(Code=code))
    block.set("Count", w * h)
    tex = SharedTexture2D.create(w, h, format="rgba8", flags=flags)
    bridge = GlBridge(engine)
    bridge.show_texture(block, "image", tex)
    engine.wait_ready()
    for level in (7, 200, 33):
        block.set("level", level)
        engine.update()
        GL.glFinish()
        GL.glBindTexture(GL.GL_TEXTURE_2D, tex.gl_name)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        got = np.frombuffer(GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE), np.uint8)
        got = got.reshape(h, w, 4)
        i = np.arange(w * h).reshape(h, w)
        assert np.array_equal(got[..., 0], i % 256) and (got[..., 1] == level).all() and (got[..., 3] == 255).all()
    bridge.close()
    tex.close()


@pytest.mark.parametrize("fmt", ["rgba8", "r32f", "rgba32f"])
def test_surface_stores_write_every_texel(gl_engine, fmt):
    import cupy as cp

    from cudapatch.interop import SharedTexture2D

    engine, _ = gl_engine
    w, h = 37, 19  # not a multiple of the thread block: the edges must be written too
    tex = SharedTexture2D.create(w, h, format=fmt, flags="surface_ldst")
    words = tex.texel_bytes // 4
    src = cp.asarray(np.random.default_rng().integers(0, 2**31, w * h * words, dtype=np.uint32))
    back = cp.full_like(src, 0xFFFFFFFF)  # poisoned
    cp.cuda.get_current_stream().synchronize()  # the engine stream does not wait for CuPy's
    s = engine.device.stream
    with tex.map(stream=s) as m:
        m.copy_from(src.data.ptr)
        m.copy_to(back.data.ptr)
    engine.synchronize()
    assert tex._writer is not None  # the surface path ran
    np.testing.assert_array_equal(cp.asnumpy(back), cp.asnumpy(src))
    tex.close()
    tex.close()  # idempotent, the writer released once


def _new_texels(tex, rng: np.random.Generator) -> np.ndarray:  # noqa: ANN001 - a SharedTexture2D
    """Fresh random RGBA8 texels written into ``tex`` by GL (finished before the next launch)."""
    from OpenGL import GL

    texels = rng.integers(0, 256, (tex.height, tex.width, 4), dtype=np.uint8)
    GL.glBindTexture(GL.GL_TEXTURE_2D, tex.gl_name)
    GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
    GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, tex.width, tex.height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
    GL.glFinish()
    return texels


def test_a_gl_texture_feeds_a_block_input_every_frame(gl_engine):
    from cudapatch.blocks.library import CustomKernel
    from cudapatch.interop import GlBridge, SharedTexture2D

    engine, _ = gl_engine
    code = """
extern "C" __global__ void swizzle(const unsigned int* texels, unsigned int* out, unsigned int count) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = (texels[i] >> 8) | 0xAB000000u;
}"""
    w, h = 48, 20
    block = engine.add(CustomKernel(Code=code))
    tex = SharedTexture2D.create(w, h, format="rgba8", flags="read_only")
    bridge = GlBridge(engine)
    bridge.bind_texture(block, "texels", tex)
    engine.wait_ready()
    rng = np.random.default_rng()
    for _ in range(3):  # new texels every frame: the copy runs before each launch
        texels = _new_texels(tex, rng)
        engine.output(block, "out").fill_bytes(0xFF)  # poisoned
        engine.update()
        words = texels.reshape(-1, 4).astype(np.uint32)
        packed = words[:, 0] | (words[:, 1] << 8) | (words[:, 2] << 16) | (words[:, 3] << 24)
        out = engine.read(block, "out")
        assert out.shape == (h, w)  # the texture's shape, carried by the binding to the output
        np.testing.assert_array_equal(out.reshape(-1), (packed >> 8) | 0xAB000000)
    with pytest.raises(InteropError, match="does not tile"):
        f32 = SharedTexture2D.create(4, 4, format="r32f")
        try:
            other = engine.add(VectorAddDouble())
            bridge.bind_texture(other, "A", f32)
        finally:
            f32.close()
    bridge.close()
    tex.close()


def test_a_gl_texture_feeds_an_image_block_as_an_image(gl_engine):
    """A bound texture carries its (height, width): image.Blur launches over it in 2-D and reads
    this frame's texels, as it does a bound (h, w, 4) array."""

    from cudapatch.blocks.library import Blur
    from cudapatch.interop import GlBridge, SharedTexture2D

    from ..gpu.test_image_blocks_gpu import _blur_ref, _close

    engine, _ = gl_engine
    w, h = 61, 37
    blur = engine.add(Blur(name="blur", Format="rgba8", Radius=3, Sigma=1.5))
    tex = SharedTexture2D.create(w, h, format="rgba8", flags="read_only")
    bridge = GlBridge(engine)
    bridge.bind_texture(blur, "In", tex)
    engine.wait_ready()
    errors = [d for d in engine.diagnostics() if d.severity == "error"]
    assert not errors, errors
    rng = np.random.default_rng()
    for _ in range(2):  # new texels each time: the copy runs before each launch
        texels = _new_texels(tex, rng)
        engine.output(blur, "Out").fill_bytes(0xA5)  # poisoned
        engine.update()
        engine.synchronize()
        _close(engine.read(blur, "Out"), _blur_ref(texels, "rgba8", 3, 1.5), "rgba8")
    bridge.close()
    tex.close()


class VectorAddDouble(Block):
    """Reads doubles: an input a 4-byte texel cannot feed."""

    def describe(self, b):
        from cudapatch.kernels.cuda_source import CudaSource

        k = b.add_kernel(
            CudaSource(
                code='extern "C" __global__ void twice(const double* a, double* o, unsigned int n)'
                "{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = 2 * a[i]; }"
            )
        )
        b.input("A", k.in_(0))
        b.output("O", k.out(1), size=like("A"))
        k.auto_grid(like("A"), count_param=2)


def _particles(engine, capacity):
    """The demo's particle chain in ``engine``, compiled; returns its ToPoints block."""
    t = _particles_unbuilt(engine, capacity)
    engine.wait_ready()
    return t


def test_preview_falls_back_to_map_unmap_when_gl_does_not_see_imported_memory(gl_engine, tmp_path, monkeypatch):
    from cudapatch.interop import read_png
    from cudapatch.interop.imported import ImportedBuffer
    from cudapatch.interop.preview import Preview

    monkeypatch.setattr(ImportedBuffer, "shares_memory", lambda self: False)  # what the driver did at 32 MiB
    engine, ctx = gl_engine
    t = _particles(engine, 100_000)
    with Preview(engine, ctx, points=(t, "Points"), overlay=False, zero_map=True) as preview:
        report = preview.run(40, out_dir=tmp_path)
        assert not preview.zero_map and preview._ring is None and preview._point_buffer is not None
        img = read_png(report.pngs[-1])
        assert (img[..., :3].astype(int).sum(axis=2) > 60).mean() > 0.005  # drawn through register + map


@pytest.mark.parametrize("zero_map", [True, False], ids=["zero-map", "map-unmap"])
def test_headless_preview_of_the_particles_writes_pngs(gl_engine, tmp_path, zero_map):
    from cudapatch.interop import read_png
    from cudapatch.interop.preview import Preview

    engine, ctx = gl_engine
    t = _particles(engine, 200_000)
    with Preview(engine, ctx, points=(t, "Points"), overlay=False, zero_map=zero_map) as preview:
        assert preview.zero_map is zero_map
        report = preview.run(90, out_dir=tmp_path, png_every=45)
        assert report.frames == 90 and [p.name for p in report.pngs] == ["frame_00045.png", "frame_00090.png"]
        img = read_png(report.pngs[-1])
        assert img.shape == (360, 640, 4)
        lit = img[..., :3].astype(int).sum(axis=2) > 60
        assert lit.mean() > 0.005, lit.mean()  # the particle cloud
        # the GL buffer holds what the engine computed
        from OpenGL import GL

        preview.frame()
        engine.synchronize()
        GL.glFinish()
        nbytes = engine.output(t, "Points").nbytes
        if preview.zero_map:  # False when the driver does not keep GL coherent (it fell back)
            preview.frame()  # the ring shows the newest completed frame: let it catch up
            engine.synchronize()
            preview._ring.front()
        gl_points = _gl_reads(preview.points_gl_buffer, nbytes)
        assert np.array_equal(gl_points, engine.read(t, "Points").view(np.float32).ravel())


def test_imported_buffer_is_shared_without_mapping(gl_engine):
    from OpenGL import GL

    from cudapatch.interop.imported import ImportedBuffer, ImportedRing, zero_map_available

    engine, ctx = gl_engine
    assert zero_map_available(ctx)  # the NVIDIA driver on Linux has GL_EXT_memory_object_fd
    rng = np.random.default_rng()
    n = 50_000
    want = rng.standard_normal(n).astype(np.float32)
    buf = ImportedBuffer(n * 4)
    _cupy_view(buf.ptr, n * 4, np.float32, buf).set(want)  # CUDA writes its own allocation
    engine.synchronize()
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buf.gl_name)
    got = np.frombuffer(GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, n * 4), np.float32)
    assert np.array_equal(got, want)  # GL's first read sees CUDA's bytes
    # GL's GPU reads keep seeing CUDA's writes (glGetBufferSubData would not: see _gl_reads)
    want = rng.standard_normal(n).astype(np.float32)
    _cupy_view(buf.ptr, n * 4, np.float32, buf).set(want)
    engine.synchronize()
    assert np.array_equal(_gl_reads(buf.gl_name, n * 4), want)
    assert buf.shares_memory()  # and the check says so; it leaves CUDA's memory zeroed
    assert not _cupy_view(buf.ptr, n * 4, np.float32, buf).get().any()
    assert not _gl_reads(buf.gl_name, n * 4).any()
    buf.close()
    buf.close()
    assert buf.is_closed

    import cupy

    ring = ImportedRing(n * 4)
    assert ring.front() is None  # nothing written yet
    frames = [cupy.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(4)]
    cupy.cuda.get_current_stream().synchronize()  # the engine stream does not wait for CuPy's
    s = engine.device.stream
    assert ring.write(frames[0].data.ptr, n * 4, s)
    engine.synchronize()
    first = ring.front()
    assert first is not None
    for f in frames[1:]:
        assert ring.write(f.data.ptr, n * 4, s)
        newest = max(range(3), key=lambda k: ring._written[k])
        assert newest != ring.front_slot  # never the buffer GL draws from
        engine.synchronize()
    assert ring.buffers[ring.front_slot].gl_name == first  # GL still shows what it fenced
    # a GPU that falls behind: pending copies are not re-recorded, the frame is dropped instead
    from cuda.bindings import driver as d

    a, b = cupy.empty(512 << 20, dtype=np.uint8), cupy.empty(512 << 20, dtype=np.uint8)
    for _ in range(8):  # milliseconds of copies queued ahead of the ring's
        assert not d.cuMemcpyDtoDAsync(b.data.ptr, a.data.ptr, a.nbytes, s)[0]
    dropped = ring.dropped
    results = [ring.write(frames[-1].data.ptr, n * 4, s) for _ in range(4)]
    assert results.count(False) >= 1 and ring.dropped > dropped
    engine.synchronize()
    GL.glFinish()
    got = _gl_reads(ring.front(), n * 4)
    assert np.array_equal(got, frames[-1].get())  # the newest completed frame
    ring.close()
    ring.close()


def test_imported_image_uploads_the_newest_copy_into_its_texture(gl_engine):
    import cupy
    from OpenGL import GL

    from cudapatch.interop.imported import ImportedImage

    engine, _ = gl_engine
    rng = np.random.default_rng()
    w, h = 97, 61  # odd sizes: rows are not a power of two
    with pytest.raises(InteropError, match="size must be positive"):
        ImportedImage(0, h)
    image = ImportedImage(w, h, label="test image")
    assert image.front() is None  # nothing written yet

    def texels() -> np.ndarray:
        GL.glBindTexture(GL.GL_TEXTURE_2D, image.gl_name)
        raw = GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE)
        GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
        return np.frombuffer(raw, np.uint8).reshape(h, w, 4)

    s = engine.device.stream
    for _ in range(3):
        want = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
        src = cupy.asarray(want)
        cupy.cuda.get_current_stream().synchronize()  # CuPy's upload is done before the engine stream copies
        assert image.ring.write(src.data.ptr, src.nbytes, s)
        engine.synchronize()
        GL.glFinish()  # GL is done with the buffers it read: the next write is not dropped
        assert image.front() == image.gl_name
        assert np.array_equal(texels(), want)  # row 0 of the texture is the first row CUDA wrote
    uploads = image.uploads
    assert image.front() == image.gl_name and image.uploads == uploads  # nothing new: no upload
    image.close()
    image.close()
    assert image.is_closed


def test_engine_feeds_an_imported_ring_from_inside_its_graph(gl_engine):
    import cupy
    from cuda.bindings import driver as d
    from OpenGL import GL

    from cudapatch import Fill
    from cudapatch.interop import GlBridge
    from cudapatch.interop.imported import ImportedRing

    engine, _ = gl_engine
    rng = np.random.default_rng()
    n = 30_000
    fill = engine.add(Fill(Count=n))
    ring = ImportedRing(n * 4)
    for b in ring.buffers:  # poisoned: a slot the graph never wrote shows NaN
        _cupy_view(b.ptr, n * 4, np.float32, b).fill(np.nan)
    bridge = GlBridge(engine)
    bridge.show_buffer_ring(fill, "Out", ring)
    with pytest.raises(InteropError, match="fed by a graph"):
        ring.write(0, 4, engine.device.stream)

    def shown() -> np.ndarray:
        return _gl_reads(ring.front(), n * 4)

    for _ in range(5):  # each frame's value reaches GL through the slot its launch was asked to write
        value = float(rng.standard_normal())
        fill.set("Value", value)
        engine.update()
        engine.synchronize()
        slots = [float(_cupy_view(b.ptr, n * 4, np.float32, b)[0].get()) for b in ring.buffers]
        state = (ring._done.value, ring._issued, list(ring._written), ring.front_slot, slots, value)
        assert np.all(shown() == np.float32(value)), state
    assert ring.dropped == 0 and ring._done.value == ring._issued == 5
    assert any(b.type_name == "GlRingWriter" for b in engine.blocks)
    # A GPU that falls behind: requests stop at the buffers it has not finished; those launches copy nothing.
    a, b = cupy.empty(512 << 20, dtype=np.uint8), cupy.empty(512 << 20, dtype=np.uint8)
    s = engine.device.stream
    for _ in range(8):
        assert not d.cuMemcpyDtoDAsync(b.data.ptr, a.data.ptr, a.nbytes, s)[0]
    values, dropped = [], ring.dropped
    for _ in range(4):
        value = float(rng.standard_normal())
        fill.set("Value", value)
        before = ring.dropped
        engine.update()
        if ring.dropped == before:
            values.append(value)
    assert ring.dropped > dropped and values  # two buffers besides GL's: at most two requests went out
    engine.synchronize()
    GL.glFinish()
    assert ring._done.value == ring._issued  # dropped launches counted nothing
    assert np.all(shown() == np.float32(values[-1]))  # the newest completed request
    bridge.close()
    engine.update()
    assert not any(b.type_name == "GlRingWriter" for b in engine.blocks)
    engine.synchronize()
    ring.close()
    ring.close()


@pytest.mark.parametrize("zero_map", [True, False], ids=["zero-map", "map-unmap"])
def test_preview_shows_an_image_output(gl_engine, zero_map):
    from cudapatch.blocks.library import CustomKernel
    from cudapatch.interop.preview import Preview

    engine, ctx = gl_engine
    code = """
extern "C" __global__ void image(unsigned int* rgba, float level, unsigned int count) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;   // 640 x 360, red ramp along x
    unsigned int green = (unsigned int)(level * 255.0f) << 8;
    if (i < count) rgba[i] = (unsigned int)((i % 640u) * 255u / 639u) | green | (255u << 24);
}"""
    block = engine.add(CustomKernel(Code=code))
    block.set("Count", 640 * 360)
    block.set("level", 0.5)
    engine.wait_ready()
    with Preview(engine, ctx, image=(block, "rgba", 640, 360), overlay=False, zero_map=zero_map) as preview:
        assert (preview._image is not None) is zero_map  # zero-map: no registered texture at all
        preview.run(5)
        preview.frame()
        img = ctx.read_pixels().astype(int)
        if zero_map:
            assert 1 <= preview._image.uploads <= 6  # one GL upload per new copy, none for an old one
    x = np.arange(640) * 255 // 639
    assert np.abs(img[180, :, 0] - x).max() <= 2  # the ramp, texel for texel
    assert np.abs(img[:, :, 1] - 127).max() <= 2 and (img[..., 3] == 255).all()


@pytest.mark.parametrize("zero_map", [True, False], ids=["zero-map", "map-unmap"])
def test_an_isolated_preview_registers_its_points_buffer_before_the_first_frame(monkeypatch, zero_map):
    """On the H100 machine, registering a GL buffer once a kernel in the child has faulted spins for
    good: the preview of an isolated engine builds the child's graph and makes the points' GL memory
    (an imported ring, or a registered buffer) before its first frame is sent (a patch that faults in
    its first frame then previews as before)."""
    from cudapatch import Engine
    from cudapatch.interop import EglContext
    from cudapatch.interop.preview import Preview
    from cudapatch.interop.shared import SharedBuffer

    frames_sent_at_register = []
    create = SharedBuffer.create.__func__

    ctx = EglContext(320, 200)
    try:
        with Engine(isolated=True) as engine:
            t = _particles_unbuilt(engine, 10_000)

            def recording_create(cls, nbytes, **kw):
                frames_sent_at_register.append(engine.counters.frames)
                return create(cls, nbytes, **kw)

            monkeypatch.setattr(SharedBuffer, "create", classmethod(recording_create))
            with Preview(engine, ctx, points=(t, "Points"), overlay=False, zero_map=zero_map) as preview:
                make_ring = preview._ring_cls

                def recording_ring(nbytes, **kw):
                    frames_sent_at_register.append(engine.counters.frames)
                    return make_ring(nbytes, **kw)

                preview._ring_cls = recording_ring
                for _ in range(5):
                    preview.frame()
                engine.synchronize()
                assert preview.zero_map is zero_map
                shared = preview._ring if zero_map else preview._point_buffer
                assert shared is not None and shared.nbytes == 10_000 * 32
    finally:
        ctx.close()
    assert frames_sent_at_register == [0]  # once, before the first frame


def _particles_unbuilt(engine, capacity):
    """The demo's particle chain in ``engine``, not built yet; returns its ToPoints block."""
    from cudapatch.blocks.library import Emitter, Forces, Integrate, ToPoints

    e, f, i, t = (engine.add(cls()) for cls in (Emitter, Forces, Integrate, ToPoints))
    e.set("Capacity", capacity)
    engine.connect(e, "Particles", f, "Particles")
    engine.connect(f, "Particles", i, "Particles")
    engine.connect(i, "Particles", t, "Particles")
    return t


def test_an_isolated_engines_outputs_reach_gl_every_frame(egl):
    """``Engine(isolated=True)``: the graph runs in a child process, which cannot write this process's
    GL memory, so the bridge copies each frame's outputs (the child's buffers, mapped here) into the GL
    buffer, texture and imported ring once the child finished the frame, on the host's stream
    (``synchronize`` copies the last one); GL sees every frame's values."""
    from OpenGL import GL

    from cudapatch import Engine, Fill, Scale
    from cudapatch.interop import GlBridge, SharedBuffer, SharedTexture2D
    from cudapatch.interop.imported import ImportedRing

    w, h = 64, 32
    with Engine(isolated=True, wait_for_compile=True) as engine:
        fill = engine.add(Fill(name="f", Count=w * h, Value=1.0))
        scale = engine.add(Scale(name="s", Factor=2.0))
        engine.connect(fill, "Out", scale, "In")
        buf = SharedBuffer.create(w * h * 4)
        tex = SharedTexture2D.create(w, h, format="r32f", flags="surface_ldst")
        bridge = GlBridge(engine)
        assert bridge.copies
        ring = ImportedRing(w * h * 4)
        for b in ring.buffers:  # poisoned: a slot never written shows NaN
            _cupy_view(b.ptr, w * h * 4, np.float32, b).fill(np.nan)
        bridge.show_buffer_ring(scale, "Out", ring)  # fed from this process: copies, no map
        for refused in (lambda: bridge.bind_buffer(scale, "In", buf), lambda: bridge.bind_texture(scale, "In", tex)):
            with pytest.raises(InteropError, match="child process"):
                refused()
        big = SharedTexture2D.create(w, 2 * h, format="r32f", flags="surface_ldst")  # more texels than the output
        bridge.show_texture(scale, "Out", big)
        bridge.show_buffer(scale, "Out", buf)
        bridge.show_texture(scale, "Out", tex)
        engine.wait_ready()
        for value in (1.5, -3.0, 7.25):
            fill.set("Value", value)
            engine.update()
            engine.synchronize()
            GL.glFinish()
            np.testing.assert_array_equal(_gl_reads(buf.gl_name, w * h * 4), np.full(w * h, 2 * value, np.float32))
            GL.glBindTexture(GL.GL_TEXTURE_2D, tex.gl_name)
            texels = np.frombuffer(GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RED, GL.GL_FLOAT), np.float32)
            np.testing.assert_array_equal(texels, np.full(w * h, 2 * value, np.float32))
            np.testing.assert_array_equal(_gl_reads(ring.front(), w * h * 4), np.full(w * h, 2 * value, np.float32))
        assert ring.dropped == 0
        assert not engine.graph  # nothing of it ran in this process's graph (and the big texture: skipped)
        bridge.close()
        buf.close()
        tex.close()
        big.close()
        ring.close()
