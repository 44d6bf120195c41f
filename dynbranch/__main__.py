"""``python -m dynbranch`` is the ``dynbranch`` command."""

import sys

from dynbranch.cli import main

sys.exit(main())
