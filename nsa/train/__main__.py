"""``python -m nsa.train`` is the same entry point as the ``nsa-train`` console script."""

import sys

from nsa.train.cli import main

sys.exit(main())
