"""``python -m gpuheal_dev``: the same as the ``gpuheal-dev`` console script."""

import sys

from gpuheal_dev.cli import main

sys.exit(main())
