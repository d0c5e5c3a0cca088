"""`python -m switch`: the software switch and its controller (switch.cli, `--help`)."""
import sys

from switch.cli import main

sys.exit(main())
