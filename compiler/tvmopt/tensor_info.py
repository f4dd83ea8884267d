"""The name, shape and dtype of a model input or output, shared by the frontend, the artifact
manifest and the runtimes (it depends on nothing else in tvmopt)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of a graph input or output.

    Shape entries are ints (static), strings (named symbolic dims, or an expression of them for
    an output) or None (known only at run time). The shape itself is None when even the rank is
    unknown.
    """

    name: str
    shape: tuple | None
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> "TensorInfo":
        shape = d.get("shape")
        return TensorInfo(d["name"], None if shape is None else tuple(shape), d["dtype"])

    def shape_str(self) -> str:
        if self.shape is None:
            return "?"
        return "x".join("?" if d is None else str(d) for d in self.shape) or "scalar"
