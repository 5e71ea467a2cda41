"""The runtime's garbage-collector policy: leave the collector alone unless asked to freeze.

The library never calls ``gc.set_threshold``, ``gc.disable`` or ``gc.freeze`` on its own. An
embedder that creates many long-lived agents may ask a runtime to freeze what exists
(``Runtime.gc_freeze()`` or ``open_runtime(gc_freeze=True)``): ``gc.collect()`` then
``gc.freeze()`` move every object the collector tracks into its permanent generation, which no
later collection walks. What a runtime froze it gives back (``gc.unfreeze()``) when it closes,
so the agents' reference cycles can be reclaimed once they are gone; it leaves the permanent
generation alone when something else had frozen objects before the runtime's first freeze (a
pre-fork server's ``gc.freeze()``, which ``gc.unfreeze()`` would undo too). See
``docs/scale.md``.
"""

from __future__ import annotations

import gc
from typing import final

__all__ = ["GcFreezer"]


@final
class GcFreezer:
    """What one runtime froze, and whether giving it back is the runtime's to do."""

    __slots__ = ("_owns", "frozen")

    def __init__(self) -> None:
        self.frozen = 0
        """Objects moved to the permanent generation by this runtime so far."""
        self._owns: bool | None = None  # decided at the first freeze

    def freeze(self) -> int:
        """Collect, then freeze every tracked object; returns how many were frozen."""
        if self._owns is None:
            # ``get_freeze_count`` walks the permanent generation: ask once, not per freeze.
            self._owns = gc.get_freeze_count() == 0
        gc.collect()  # garbage frozen now would stay until the unfreeze
        # No generator here: it would be counted, then freed before the freeze.
        added = len(gc.get_objects(0)) + len(gc.get_objects(1)) + len(gc.get_objects(2))
        gc.freeze()
        self.frozen += added
        return added

    def release(self) -> None:
        """Unfreeze, when this runtime froze something and nobody had frozen before it."""
        if self.frozen and self._owns:
            gc.unfreeze()
        self.frozen = 0
        self._owns = None
