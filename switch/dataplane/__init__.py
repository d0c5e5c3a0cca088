"""The software switch's data plane: frames in, frames out, no control logic.

`packets` parses and re-signs RoCE frames (the one place headers are parsed by hand),
`ports` moves frames between ports and calls the pipeline hook, `pipeline` is the
single-switch aggregation of docs/pipeline.md, `tor` and `spine` the two fabric roles and
`interswitch` the packets between them (docs/multirack.md). A new role goes here. Modules
here import only each other and `nr_contract.spec`.
"""
