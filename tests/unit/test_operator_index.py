"""The host adapter's link and placement bookkeeping (``host_plugin/operator_index.py``) beside plain
lists and dicts that scan everything, over random edits (no GPU)."""

from __future__ import annotations

import random

from cudapatch.host_plugin.operator_index import OperatorLink, OperatorLinks, Placements


def test_operator_links_hold_what_a_list_of_every_link_holds_over_random_edits() -> None:
    # Property: one link per input (a new one replaces the one there, in the order made), and the
    # links of an operator, a delete and a rename give what scanning a plain list gives.
    rng = random.Random(20261127)
    ops = [f"op{i}" for i in range(8)]
    for _ in range(40):
        index, model = OperatorLinks(), []
        names = list(ops)
        for _ in range(300):
            step = rng.random()
            if step < 0.5:
                lk = OperatorLink(rng.choice(names), "Out", rng.choice(names), rng.choice(("a", "b")))
                model = [m for m in model if (m.dst, m.dst_port) != (lk.dst, lk.dst_port)] + [lk]
                index.add(lk)
            elif step < 0.65 and model:
                lk = rng.choice(model) if rng.random() < 0.8 else OperatorLink("op0", "Out", "op1", "z")
                assert index.remove(lk) is (lk in model)
                model = [m for m in model if m != lk]
            elif step < 0.8:
                gone = rng.choice(names)
                index.remove_operator(gone)
                model = [m for m in model if gone not in (m.src, m.dst)]
            else:
                old = rng.choice(names)
                new = f"n{rng.randrange(10**6)}"
                names[names.index(old)] = new
                index.rename(old, new)
                model = [
                    OperatorLink(new if m.src == old else m.src, m.src_port, new if m.dst == old else m.dst, m.dst_port)
                    for m in model
                ]
            assert list(index) == model and len(index) == len(model)
            for op in names:
                assert index.of(op) == [m for m in model if op in (m.src, m.dst)]


def test_placements_hold_what_a_dict_of_every_operator_holds_over_random_edits() -> None:
    # Property: placing, deleting (what a region held moves to the region around it) and renaming
    # (as an operator and as a region) give what rewriting one dict gives.
    rng = random.Random(7)
    for _ in range(40):
        index, model = Placements(), {}
        names = [f"op{i}" for i in range(8)]
        for _ in range(300):
            step = rng.random()
            op = rng.choice(names)
            if step < 0.5:
                region = rng.choice([None, *names])
                if region == op:
                    continue
                index.place(op, region)
                model.pop(op, None)
                if region is not None:
                    model[op] = region
            elif step < 0.75:
                outer = model.pop(op, None)
                for child in [c for c, r in model.items() if r == op]:
                    if outer is None:
                        del model[child]
                    else:
                        model[child] = outer
                index.remove_operator(op)
            else:
                new = f"n{rng.randrange(10**6)}"
                names[names.index(op)] = new
                index.rename(op, new)
                model = {(new if c == op else c): (new if r == op else r) for c, r in model.items()}
            assert index.as_dict() == model
            for name in names:
                assert index.region(name) == model.get(name)
                assert sorted(index.held(name)) == sorted(c for c, r in model.items() if r == name)


def test_a_patch_listing_two_links_into_one_input_keeps_the_last_across_reloads() -> None:
    # The adapter holds one link per input (as the engine does): reapplying the same file must not
    # link the first one listed again (a rebuild at every reload, and the live link flipping).
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch

    from .plan_engine import PlanOnlyEngine

    reg = PluginHost().registry
    text = (
        'links = ["A.Out -> S.In", "B.Out -> S.In"]\n\n[operators.A]\ntype = "Fill"\nCount = 8\n\n'
        '[operators.B]\ntype = "Fill"\nCount = 8\n\n[operators.S]\ntype = "Scale"\n'
    )
    eng = PlanOnlyEngine()
    adapter = HostAdapter(eng, reg)
    first = parse_patch(text, path="p.toml", registry=reg)
    apply_patch(adapter, first)
    b, s = adapter.block("B"), adapter.block("S")
    assert eng.context.connections.link_into(s.id, "In").src == b.id
    eng.context.dirty.clear_structure()
    counts = apply_patch(adapter, parse_patch(text, path="p.toml", registry=reg), first)
    assert counts["links"] == 0 and not eng.context.dirty.any
    assert eng.context.connections.link_into(s.id, "In").src == b.id
    assert [(lk.src, lk.dst) for lk in adapter.links()] == [("B", "S")]
