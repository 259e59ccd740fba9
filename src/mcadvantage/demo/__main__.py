"""``python -m mcadvantage.demo``: see :mod:`mcadvantage.demo.run`."""

import sys

from mcadvantage.demo.run import main

if __name__ == "__main__":
    sys.exit(main())
