"""``python -m nsa.train`` is the same entry point as the ``nsa-train`` console script."""

import sys

from nsa.train.cli import main

if __name__ == "__main__":  # not when a spawned process (the data loader's) imports it
    sys.exit(main())
