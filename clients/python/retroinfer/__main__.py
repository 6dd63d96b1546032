"""python -m retroinfer: the retroinfer-ctl command line (retroinfer/cli.py)."""
import sys

from retroinfer.cli import main

sys.exit(main())
