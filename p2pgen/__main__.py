"""`python -m p2pgen` runs the command line."""

import sys

from p2pgen.cli import main

sys.exit(main())
