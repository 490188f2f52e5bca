"""``python -m headsweep.cli``: the ``headsweep`` command."""

import sys

from headsweep.cli import main

sys.exit(main())
