"""`python -m switch`: the software switch and its controller (switch.daemon, `--help`)."""
import sys

from switch.daemon import main

sys.exit(main())
