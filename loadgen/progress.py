"""Progress bars of the load generator: tqdm's when it is installed (the `bench` extra), silent
counters otherwise, so that the benchmarks also run where only the runtime is installed."""
from __future__ import annotations


class Silent:
    """What the callers use of a tqdm bar, showing nothing."""

    def __init__(self, total: int | None = None, **_ignored) -> None:
        self.total, self.n = total, 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass

    def __enter__(self) -> "Silent":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def bar(total: int | None = None, *, disable: bool = False, **options):
    """tqdm(total=..., **options) when shown and installed; a Silent counter otherwise."""
    if not disable:
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, **options)
    return Silent(total)
