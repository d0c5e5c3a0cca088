"""The SwitchML benchmark's output lines that `netreduce bench` prints, as regular
expressions written from that format (docs/benchmarks.md), not from the code that prints
them: a job line, the four statistics lines and the standard deviation, each figure
between '#'s."""
from __future__ import annotations

import re

#: "Job(s) #I# finished. Duration: #NS# ns Goodput: #GBPS# Gbps."
JOB_LINE = re.compile(r"Job\(s\) #(-?\d+)# finished\. Duration: #(\d+)# ns "
                      r"Goodput: #(\d+\.\d{4})# Gbps\.")
#: "  Min|Max|Median|Mean: #NS# ns Goodput: #GBPS# Gbps."
STAT_LINE = re.compile(r"  (Min|Max|Median|Mean): #(\d+)# ns Goodput: #(\d+\.\d{4})# Gbps\.")
#: "  Std dev: #NS# ns"
STD_LINE = re.compile(r"  Std dev: #(\d+)# ns")
