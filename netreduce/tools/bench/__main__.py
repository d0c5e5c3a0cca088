"""`python -m netreduce.tools.bench ...` = `netreduce bench ...`."""
import sys

from netreduce.tools.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
