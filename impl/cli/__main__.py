"""`python -m unsee.impl.cli`: the unsee command."""

import sys

from unsee.impl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
