"""``PlanOnlyEngine``: the engine's editing surface on the real ``Context`` and graph compiler, with no
device. Host-adapter and patch tests run against it on machines without a GPU; ``update()`` compiles
the patch into a ``GraphPlan`` exactly as the engine does before it realizes one. (The GPU tests
cover the same flows on a real ``Engine``.)"""

from __future__ import annotations

from cudapatch.engine import Context, compile_plan
from cudapatch.engine.probes import ProbeSet
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import GraphCompileError


class PlanOnlyEngine:
    def __init__(self, *, fuse: bool = True) -> None:  # ``fuse``: as ``Engine(fuse=...)``
        self.fuse = fuse
        self.context = Context()
        self.plan = None
        self.errors = ()
        self.profiling = ProfilingLevel.NONE
        self.updates = 0
        self._probes = ProbeSet(self.context, lambda: None)  # no graph runs: stats stay None

    def add(self, block, *, region=None):
        self.context.register_block(block)
        if region is not None:
            self.context.place(block, region)
        return block

    def place(self, block, region):
        self.context.place(block, region)

    def remove(self, block):
        self.context.unregister_block(block)

    def connect(self, src, src_port, dst, dst_port):
        self.context.connect(src, src_port, dst, dst_port)

    def disconnect(self, src, src_port, dst, dst_port):
        return self.context.disconnect(src, src_port, dst, dst_port)

    def keep(self, block, port, keep=True):
        self.context.keep(block, port, keep)

    def probe(self, block, port, *, shape=None):
        return self._probes.add(block, port, shape)

    def set_profiling(self, level):
        self.profiling = ProfilingLevel.parse(level)

    def update(self):
        self.updates += 1
        try:
            self.plan = compile_plan(self.context.snapshot(), level=self.profiling, fuse=self.fuse)
            self.errors = ()
        except GraphCompileError as exc:
            self.errors = exc.diagnostics

    def diagnostics(self, block=None):
        diags = tuple(self.errors) + (tuple(self.plan.diagnostics) if self.plan else ())
        return diags if block is None else tuple(d for d in diags if d.block_id == block.id)
