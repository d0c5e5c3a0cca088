"""`python -m netreduce.bench ...` = `netreduce bench ...`."""
import sys

from netreduce.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
