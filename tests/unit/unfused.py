"""``compile_plan`` with fusion off, for the tests about one node per block: their chains of Scale
blocks would otherwise fuse into one kernel (the default since fusion is on by default, as in
``Engine``). What fusion does, and that fused plans compute what these plans compute, is tested in
``test_fusion.py``; a test passing ``fuse=`` itself overrides this."""

from __future__ import annotations

from functools import partial

from cudapatch.engine import compile_plan as _compile_plan

compile_plan = partial(_compile_plan, fuse=False)
