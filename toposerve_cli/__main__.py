"""``python -m toposerve``: the same command line as the ``toposerve`` script."""

import sys

from toposerve.main import main

sys.exit(main())
