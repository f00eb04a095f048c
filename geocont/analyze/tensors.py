"""What a checkpoint is, whatever its format: its tensors as their headers describe them.

checkpoint.py (safetensors, and the dispatch by format) and gguf_file.py (GGUF) both build these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}  # the float dtypes a matrix may have


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    shape: tuple[int, ...]  # PyTorch orientation: (out, in) for a matrix
    dtype: str  # safetensors spelling (BF16, F16, F32, ...) or a GGUF type name (Q4_1, Q8_0, Q6_K, F16, ...)
    offset: int | None = None  # GGUF only: byte offset of the data in `file` (safetensors reads by name)
    nbytes: int | None = None  # GGUF only: bytes of the stored (possibly quantized) data

    @property
    def row_bytes(self) -> int:
        """Stored bytes of one row (GGUF quantizes along rows, so a block of rows is a byte range)."""
        if self.nbytes is not None:
            return self.nbytes // self.shape[0]
        return math.prod(self.shape[1:]) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class Checkpoint:
    source: str  # what the user typed
    root: Path  # folder holding the files
    config: dict | None  # config.json, when there is one (GGUF: built from the file's metadata)
    tensors: dict[str, TensorInfo]
    format: str = "safetensors"  # or "gguf"


def capped(problems: list[str], most: int = 10) -> list[str]:
    """At most `most` lines: a broken 70B checkpoint should not print a thousand of them."""
    extra = len(problems) - most
    return problems if extra <= 0 else [*problems[:most], f"... and {extra} more problems like these"]
