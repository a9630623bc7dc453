"""``python -m tutorial_utils.te_on_cpu [--devices N] script.py``: run an unmodified TE script on
CPU."""

import sys

from .runner import main

sys.exit(main())
