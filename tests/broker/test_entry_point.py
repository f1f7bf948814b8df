"""``python -m broker`` helpers that need no running server."""

from __future__ import annotations

import gc

from broker.__main__ import _freeze_startup_objects


def test_startup_objects_are_frozen_out_of_full_collections() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        _freeze_startup_objects()
        assert gc.get_freeze_count() > 1000  # the imported modules' objects at least
    finally:
        gc.unfreeze()
