"""`python -m exporter` is `specwatch`."""

import sys

from exporter.cli import main

sys.exit(main())
