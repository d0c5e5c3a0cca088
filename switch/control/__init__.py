"""The switch's control side: the gRPC service of nr_contract/control.proto (`service`), the
`Target` interface and the software target (`target`), the BMv2 target (`bmv2`), the fabric's
targets (`fabric`) and the RPC between the fabric's switches (`fabric_rpc`). A new target goes
here, as a `target.Target`. Modules here program a data plane; they never touch packets.
"""
