"""Progress bars for the long steps (converting a model, quantizing a test checkpoint): tqdm,
shown on a terminal and silent otherwise (tqdm's ``disable=None``), or forced with ``show``."""
from __future__ import annotations

from typing import Iterable, Optional, TypeVar

T = TypeVar("T")


def track(items: Iterable[T], desc: str, show: Optional[bool] = None, unit: str = "module") -> Iterable[T]:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with transformers; without it there is no bar
        return items
    return tqdm(items, desc=desc, unit=unit, leave=False, disable=None if show is None else not show)
