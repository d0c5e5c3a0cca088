"""The one home of pyverbs: `host` opens the rxe device, registers memory and builds the ring's
QPs in explicit state steps; `link` posts RDMA WRITE WITH IMMEDIATE and polls completions on
them (the `flowctl.link.Link` of real verbs). Nothing else in the project imports pyverbs.
"""
