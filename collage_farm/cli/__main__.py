"""``python -m collage_farm.cli``: the ``collage-farm`` command."""

from __future__ import annotations

import sys

from collage_farm.cli.main import main

sys.exit(main())
