"""``python -m cudapatch`` is the ``cudapatch`` command."""

import sys

from .cli import main

sys.exit(main())
