"""``python -m broker``: the same as the ``pynsqd`` command."""

from .cli import main

raise SystemExit(main())
