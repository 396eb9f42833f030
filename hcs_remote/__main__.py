"""``python -m hcs_remote [host:port]``: whether a worker answers this task, and what it serves."""

import sys

from .client import main

sys.exit(main())
