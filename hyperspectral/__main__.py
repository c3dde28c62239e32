"""``python -m hyperspectral``."""

from lbtrain.malloc import tune_malloc

# Before torch is imported (by .cli): see lbtrain/malloc.py for why and by how much.
tune_malloc()

from .cli import main  # noqa: E402

raise SystemExit(main())
