"""A test double of the parts of TouchDesigner's Python API the binding uses.

TouchDesigner does not run on Linux test machines. This double follows the documented API
(derivative.ca/UserGuide: COMP_Class, Page_Class, Par_Class, scriptTOP_Class, TOP_Class,
CUDAMemory_Class, CUDAMemoryShape_Class) — names, signatures, the ``stream`` keyword, and
``CUDAMemory`` lifetime (the memory is valid only while the object lives: the double frees its
memory when the object is collected, so a binding that drops it early reads freed memory).
It is not TouchDesigner; keep it faithful to those pages when changing it.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

_PAR_NAME = re.compile(r"^[A-Z][a-z0-9]*$")


class Par:
    def __init__(self, owner: COMP, name: str, label: str, style: str) -> None:
        self.owner, self.name, self.label, self.style = owner, name, label, style
        self.val: Any = 0
        self.default: Any = 0
        self.normMin: float = 0.0
        self.normMax: float = 1.0
        self.page: Page | None = None
        self.valid = True

    def eval(self) -> Any:
        return self.val

    @property
    def order(self) -> int:
        """The parameter's position on its page (settable on custom parameters)."""
        assert self.page is not None
        return self.page.pars.index(self)

    @order.setter
    def order(self, index: int) -> None:
        assert self.page is not None
        self.page.pars.remove(self)
        self.page.pars.insert(int(index), self)

    def destroy(self) -> None:
        """Destroy this custom parameter; destroying it twice raises."""
        if not self.valid:
            raise RuntimeError(f"parameter {self.name} has already been destroyed")
        self.valid = False
        if self.page is not None:
            self.page.pars.remove(self)
        if getattr(self.owner.par, self.name, None) is self:
            delattr(self.owner.par, self.name)


class Page:
    def __init__(self, owner: COMP, name: str) -> None:
        self.owner, self.name, self.pars = owner, name, []

    def _append(self, name: str, label: str | None, size: int, style: str, replace: bool) -> list[Par]:
        if not _PAR_NAME.match(name):  # TouchDesigner's rule for custom parameter names
            raise ValueError(f"Invalid parameter name: {name}")
        names = [name] if size == 1 else [f"{name}{i + 1}" for i in range(size)]
        pars = [Par(self.owner, n, label or name, style) for n in names]
        for p in pars:
            old = getattr(self.owner.par, p.name, None)
            if old is not None:  # ``replace``: the new parameter takes the old one's place
                if not replace:
                    raise ValueError(f"Parameter already exists: {p.name}")
                at = old.order if old.page is self else len(self.pars)
                old.destroy()
                self.pars.insert(at, p)
            else:
                self.pars.append(p)
            p.page = self
            setattr(self.owner.par, p.name, p)
        return pars

    def appendFloat(self, name: str, label: str | None = None, size: int = 1, order: Any = None, replace: bool = True):
        return self._append(name, label, size, "Float", replace)

    def appendInt(self, name: str, label: str | None = None, size: int = 1, order: Any = None, replace: bool = True):
        return self._append(name, label, size, "Int", replace)

    def appendStr(self, name: str, label: str | None = None, order: Any = None, replace: bool = True):
        return self._append(name, label, 1, "Str", replace)


class _ParCollection:
    pass


class OP:
    def __init__(self, path: str) -> None:
        self.path = path
        self.name = path.rsplit("/", 1)[-1]
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def addError(self, msg: str) -> None:
        self.errors.append(msg)

    def addWarning(self, msg: str) -> None:
        self.warnings.append(msg)


class COMP(OP):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.par = _ParCollection()
        self.customPages: list[Page] = []

    def appendCustomPage(self, name: str) -> Page:
        page = Page(self, name)
        self.customPages.append(page)
        return page


class CUDAMemoryShape:
    def __init__(self) -> None:
        self.width = 0
        self.height = 0
        self.numComps = 4
        self.depth = 1
        self.dataType: Any = "float32"


class CUDAMemory:
    """``ptr``/``size``/``shape`` of a TOP's memory; valid only while this object is alive."""

    live = 0

    def __init__(self, array: Any, shape: CUDAMemoryShape) -> None:
        self._array = array  # a CuPy array owns the device memory, freed with this object
        self.ptr = int(array.data.ptr)
        self.size = int(array.nbytes)
        self.shape = shape
        CUDAMemory.live += 1
        weakref.finalize(self, CUDAMemory._died)

    @staticmethod
    def _died() -> None:
        CUDAMemory.live -= 1


class TOP(OP):
    def __init__(self, path: str, array: Any = None, shape: CUDAMemoryShape | None = None) -> None:
        super().__init__(path)
        self._array, self._shape = array, shape
        self.streams: list[Any] = []

    def cudaMemory(self, stream: Any = None) -> CUDAMemory:
        self.streams.append(stream)
        return CUDAMemory(self._array.copy(), self._shape)  # a fresh object (and memory) per call


class scriptTOP(TOP):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.copies: list[dict[str, Any]] = []

    def copyCUDAMemory(self, address: int, size: int, shape: CUDAMemoryShape, stream: Any = None) -> None:
        import numpy as np
        from cuda.bindings import driver as d

        data = np.empty(size, np.uint8)
        (err,) = d.cuMemcpyDtoHAsync(data.ctypes.data, address, size, stream or 0)  # ordered on that stream
        assert not err, err
        (err,) = d.cuStreamSynchronize(stream or 0)
        assert not err, err
        self.copies.append({"address": address, "size": size, "shape": shape, "stream": stream, "data": data})
