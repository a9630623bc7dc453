"""``python -m tutorial_utils.te_on_cpu [--devices N] script.py``: a TE script, run on CPU."""

import sys

from .runner import main

sys.exit(main())
