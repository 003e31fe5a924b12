"""`python -m specwatch` is `specwatch`."""

import sys

from .cli import main

sys.exit(main())
