"""The P4 program for BMv2 (v1model): the `.p4` sources, and `program`, which generates the
derived source, compiles it with p4c and reads `limits.p4`, the P4 twin of `nr_contract.spec`.
"""
