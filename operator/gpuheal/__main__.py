"""`python -m gpuheal ...` is `gpuheal ...`."""

import sys

from gpuheal.cli import main

sys.exit(main())
