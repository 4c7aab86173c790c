"""Import-time stand-in for SGLang's kernels package (``sgl_kernel``) on CPU boxes.

SGLang 0.5.23 imports ``sgl_kernel`` while starting (``sglang/kernels/ops/kvcache/cache_move.py``) even
with ``--device cpu --attention-backend torch_native``, a path that calls none of its kernels. The
registry's ``sgl-kernel`` wheels are CUDA-only and the CPU build is not published, so this package lets
the server import; any kernel that is actually *called* raises ``NotImplementedError`` naming itself,
so nothing silently computes a wrong result.
"""

from __future__ import annotations

from typing import Any, NoReturn

__version__ = "0.0.0+cpu-standin"
__all__: list[str] = []

STANDIN = True


class _Unavailable:
    """A kernel this stand-in does not have: importing it works, calling it raises."""

    def __init__(self, name: str) -> None:
        self.__name__ = name
        self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{self.__name__} was called, but this is the CPU import-time stand-in "
            "(scripts/sgl_kernel_standin): this SGLang code path needs the real sgl-kernel build"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in for {self.__name__}>"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(name)
