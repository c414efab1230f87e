"""``python -m geodiloco``: the ``geodiloco`` command."""
import sys

from geodiloco.runtime.cli import main

sys.exit(main())
