"""``PatchDocument``: a patch file edited in place, keeping its comments, order and layout.

The node editor writes every edit back to the patch file the user also edits by hand. A plain
``tomllib`` read and a fresh dump would drop the comments and reorder the tables, so the document is
held as a ``tomlkit`` tree, which round-trips: text that is not edited comes back byte for byte,
and an edit changes only the lines it concerns (a value, an operator's table, one entry of
``links``). Every method is a pure text edit: nothing here validates a block type or touches an
engine (``parse_patch`` checks the result, the ``HostAdapter`` applies it).

An operator's ``region = "loop"`` (the If, While or For holding it) and ``fuse = false`` (an
elementwise block kept out of fused groups) are keys of its table like a parameter's:
``set_region`` writes or removes the region, ``set_param(op, "fuse", False)`` the flag; renaming or
removing a region rewrites the operators it holds (removed: they move to the region around it, as
the host adapter moves them).

The editor's own settings live in an ``[editor]`` table: node positions
(``[editor.positions] emit = [40.0, 60.0]``, for the editor only) and the bypassed operators
(``bypassed = ["blur"]``, which ``apply_patch`` applies wherever the file is loaded or reloaded).
"""

from __future__ import annotations

import re
from typing import Any

import tomlkit
from tomlkit.items import Array, Table

__all__ = ["PatchDocument", "EDITOR_KEY"]

#: The top-level table holding the editor's settings (positions, bypass).
EDITOR_KEY = "editor"


def _plain(value: Any) -> Any:
    """A value as TOML takes it: tuples become lists (vector parameters)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


class PatchDocument:
    """A patch file's text as an editable, round-tripping TOML tree.

    Args:
        text: The patch file's text (parsed by ``tomlkit``; the caller has validated it).
    """

    def __init__(self, text: str) -> None:
        self._doc = tomlkit.parse(text)

    @property
    def text(self) -> str:
        """The document as text (unchanged parts byte for byte as read)."""
        return self._doc.as_string()

    # -- operators --------------------------------------------------------------------------------------
    def _operators(self, create: bool = False) -> Table | None:
        ops = self._doc.get("operators")
        if ops is None and create:
            ops = tomlkit.table(is_super_table=True)
            self._doc["operators"] = ops
        return ops

    def operator(self, name: str) -> Table:
        """The table of operator ``name``.

        Raises:
            KeyError: no such operator.
        """
        ops = self._operators()
        if ops is None or name not in ops:
            raise KeyError(name)
        return ops[name]

    def add_operator(
        self,
        name: str,
        type_name: str,
        params: dict[str, Any] | None = None,
        region: str | None = None,
        *,
        fuse: bool = True,
    ) -> None:
        """Append ``[operators.name]`` after the last operator, with ``type``, ``region``, ``fuse = false``
        (only when ``fuse`` is off: on is the default) and ``params``."""
        table = tomlkit.table()
        table["type"] = type_name
        if region is not None:
            table["region"] = region
        if not fuse:
            table["fuse"] = False
        for key, value in (params or {}).items():
            table[key] = _plain(value)
        table.add(tomlkit.nl())  # a blank line before whatever table follows
        self._operators(create=True)[name] = table  # type: ignore[index]

    def remove_operator(self, name: str) -> None:
        """Delete ``[operators.name]``; its links, preview references and editor settings go too. The
        operators a removed region held move to the region around it (or to the top level)."""
        ops = self._operators()
        outer = self.region(name) if ops is not None and name in ops else None
        if ops is not None and name in ops:
            del ops[name]
        for op in [op for op in (ops or {}) if self.region(str(op)) == name]:
            self.set_region(str(op), outer)
        for link in [lk for lk in self.links() if self._link_ops(lk) & {name}]:
            self.remove_link(link)
        self._forget_editor(name)

    def set_param(self, op: str, key: str, value: Any) -> None:
        """Set ``key = value`` in the operator's table (replaced in place, or appended)."""
        # tomlkit puts a new key after the table's last value, before the blank line that follows it.
        self.operator(op)[key] = _plain(value)

    def remove_param(self, op: str, key: str) -> None:
        """Delete ``key`` from the operator's table (the block goes back to its default)."""
        table = self.operator(op)
        if key in table:
            del table[key]

    def region(self, op: str) -> str | None:
        """The region operator holding ``op`` (its ``region`` key), None at the top level."""
        value = self.operator(op).get("region")
        return str(value) if isinstance(value, str) else None

    def set_region(self, op: str, region: str | None) -> None:
        """Put ``op`` in region operator ``region`` (``region = "..."`` in its table), or at the top
        level with None (the key is removed)."""
        if region is None:
            self.remove_param(op, "region")
        else:
            self.operator(op)["region"] = region

    def rename_operator(self, old: str, new: str) -> None:
        """Rename an operator: its table header, its links, preview references and editor settings."""
        text = self._doc.as_string()
        header = re.compile(
            r'^(\s*\[\s*operators\s*\.\s*)(?:"' + re.escape(old) + r'"|' + re.escape(old) + r")(\s*\])", re.M
        )
        text, n = header.subn(lambda m: f"{m.group(1)}{new}{m.group(2)}", text, count=1)
        if n == 0:
            raise KeyError(old)
        self._doc = tomlkit.parse(text)
        for op in list(self._operators() or {}):  # a renamed region: the operators it holds name it
            if self.region(str(op)) == old:
                self.set_region(str(op), new)
        links = self._doc.get("links")
        if isinstance(links, Array):
            for i, item in enumerate(list(links)):
                renamed = _rename_in_link(str(item), old, new)
                if renamed != str(item):
                    links[i] = renamed
        preview = self._doc.get("preview")
        if isinstance(preview, Table):
            for key in ("points", "image"):
                ref = preview.get(key)
                if isinstance(ref, str) and ref.partition(".")[0] == old:
                    preview[key] = new + "." + ref.partition(".")[2]
        editor = self._doc.get(EDITOR_KEY)
        if isinstance(editor, Table):
            positions = editor.get("positions")
            if isinstance(positions, Table) and old in positions:
                xy = list(positions[old])
                del positions[old]
                positions[new] = xy
            bypassed = editor.get("bypassed")
            if isinstance(bypassed, Array):
                for i, item in enumerate(list(bypassed)):
                    if str(item) == old:
                        bypassed[i] = new

    # -- links ------------------------------------------------------------------------------------------
    def links(self) -> list[str]:
        """The ``links`` entries as written."""
        links = self._doc.get("links")
        return [str(x) for x in links] if isinstance(links, Array) else []

    def add_link(self, link: str) -> None:
        """Append ``"a.Out -> b.In"`` to ``links`` (created before the first table if missing)."""
        links = self._doc.get("links")
        if not isinstance(links, Array):
            links = tomlkit.array()
            links.multiline(True)
            # Values go before the first table, or TOML would read them as keys of that table; after
            # the file's leading comments, which describe the whole file.
            body = self._doc.body
            first = next((i for i, (k, v) in enumerate(body) if isinstance(v, Table)), len(body))
            body.insert(first, (tomlkit.key("links"), links))
            body.insert(first + 1, (None, tomlkit.nl()))
            self._doc = tomlkit.parse(self._doc.as_string())
            links = self._doc["links"]
        links.append(link)

    def remove_link(self, link: str) -> bool:
        """Remove the entry equal to ``link`` (spacing ignored); returns whether there was one."""
        links = self._doc.get("links")
        if not isinstance(links, Array):
            return False
        want = _norm_link(link)
        for i, item in enumerate(list(links)):
            if _norm_link(str(item)) == want:
                del links[i]
                return True
        return False

    @staticmethod
    def _link_ops(link: str) -> set[str]:
        src, _, dst = link.partition("->")
        return {src.strip().partition(".")[0], dst.strip().partition(".")[0]}

    # -- editor settings ------------------------------------------------------------------------------------
    def _editor(self, create: bool) -> Table | None:
        editor = self._doc.get(EDITOR_KEY)
        if editor is None and create:
            editor = tomlkit.table()
            self._doc[EDITOR_KEY] = editor
        return editor if isinstance(editor, Table) else None

    def positions(self) -> dict[str, tuple[float, float]]:
        """Node positions by operator (entries that are not two numbers are ignored)."""
        editor = self._editor(False)
        positions = editor.get("positions") if editor is not None else None
        out: dict[str, tuple[float, float]] = {}
        if isinstance(positions, Table):
            for op, xy in positions.items():
                if isinstance(xy, list) and len(xy) == 2 and all(isinstance(v, (int, float)) for v in xy):
                    out[str(op)] = (float(xy[0]), float(xy[1]))
        return out

    def set_position(self, op: str, x: float, y: float) -> None:
        """Store an operator's node position (rounded to a tenth of a pixel: the file stays readable)."""
        editor = self._editor(True)
        positions = editor.get("positions")  # type: ignore[union-attr]
        if not isinstance(positions, Table):
            positions = tomlkit.table()
            editor["positions"] = positions  # type: ignore[index]
        positions[op] = [round(float(x), 1), round(float(y), 1)]

    def bypassed(self) -> list[str]:
        """Operators the editor bypassed."""
        editor = self._editor(False)
        items = editor.get("bypassed") if editor is not None else None
        return [str(x) for x in items] if isinstance(items, Array) else []

    def set_bypassed(self, op: str, on: bool) -> None:
        """Add ``op`` to, or remove it from, ``[editor] bypassed``."""
        editor = self._editor(on)
        if editor is None:
            return
        items = editor.get("bypassed")
        if not isinstance(items, Array):
            if not on:
                return
            # Before any sub-table of [editor], so it stays a key of [editor] itself.
            editor.value.body.insert(0, (tomlkit.key("bypassed"), tomlkit.array()))
            self._doc = tomlkit.parse(self._doc.as_string())
            editor = self._editor(True)
            items = editor["bypassed"]  # type: ignore[index]
        names = [str(x) for x in items]
        if on and op not in names:
            items.append(op)
        elif not on and op in names:
            del items[names.index(op)]

    def _forget_editor(self, op: str) -> None:
        editor = self._editor(False)
        if editor is None:
            return
        positions = editor.get("positions")
        if isinstance(positions, Table) and op in positions:
            del positions[op]
        self.set_bypassed(op, False)


def _norm_link(text: str) -> str:
    src, _, dst = text.partition("->")
    return f"{src.strip()} -> {dst.strip()}"


def _rename_in_link(text: str, old: str, new: str) -> str:
    src, arrow, dst = text.partition("->")
    if not arrow:
        return text

    def one(end: str) -> str:
        stripped = end.strip()
        op, dot, port = stripped.partition(".")
        return end.replace(stripped, f"{new}.{port}") if op == old and dot else end

    return f"{one(src)}{arrow}{one(dst)}"
