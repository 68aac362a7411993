"""``python -m nsa_tui.cli``: the same as the ``nsa-tui`` command."""

import sys

from nsa_tui.cli.main import main

sys.exit(main())
