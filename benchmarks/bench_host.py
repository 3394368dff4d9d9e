#!/usr/bin/env python3
"""Host adapter overhead: a cook through the adapter with 100 operators beside a bare
``Engine.update()`` of the same patch, and a parameter change through the adapter (with host value
coercion) beside ``block.set``. Host microseconds, medians, in the same run.

Usage: ``python benchmarks/bench_host.py``; writes ``host.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import host_us  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.host_plugin import HostAdapter, PluginHost  # noqa: E402


def main() -> None:
    engine = Engine(name="host-bench", wait_for_compile=True)
    adapter = HostAdapter(engine, PluginHost().registry)
    adapter.create("op0", "core.Fill", {"Count": 1024})
    for i in range(1, 100):
        adapter.create(f"op{i}", "core.Scale", {"Factor": 1.0001})
        adapter.connect(f"op{i - 1}", "Out", f"op{i}", "In")
    engine.wait_ready()
    for _ in range(50):
        engine.update()
    sync = engine.synchronize
    bare = host_us(engine.update, 5000, sync, every=200)
    cook = adapter.engine_operator.cook
    cooked = host_us(cook, 5000, sync, every=200)
    block = adapter.block("op50")
    vals = [1.0, 1.5]
    k = [0]

    def set_direct() -> None:
        k[0] ^= 1
        block.set("Factor", vals[k[0]])

    def set_adapter() -> None:
        k[0] ^= 1
        adapter.set_param("op50", "Factor", vals[k[0]])

    def set_adapter_str() -> None:
        k[0] ^= 1
        adapter.set_param("op50", "Factor", "1.5" if k[0] else "1.0")

    direct = host_us(set_direct, 5000)
    via = host_us(set_adapter, 5000)
    via_str = host_us(set_adapter_str, 5000)
    engine.update()
    engine.synchronize()
    rows = {
        "update_us": bare,
        "cook_us": cooked,
        "cook_overhead_us": cooked - bare,
        "block_set_us": direct,
        "adapter_set_param_us": via,
        "adapter_set_param_string_us": via_str,
    }
    print(f"{'Engine.update(), 100 blocks':40s} {bare:8.2f} µs")
    print(f"{'EngineOperator.cook()':40s} {cooked:8.2f} µs   overhead {cooked - bare:+.2f} µs (target <= 10)")
    print(f"{'block.set (peer)':40s} {direct:8.2f} µs")
    print(f"{'adapter.set_param(float)':40s} {via:8.2f} µs   {via / direct:.2f}x  (target <= 10 µs)")
    print(f"{'adapter.set_param(TD string)':40s} {via_str:8.2f} µs")
    write_results("host.json", rows)
    engine.close()


if __name__ == "__main__":
    main()
