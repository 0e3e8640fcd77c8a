"""``python -m mmrl ...``: the ``mmrl`` command (`mmrl.cli`)."""

import sys

from mmrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
