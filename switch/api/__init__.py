"""The controller's typed API (control.proto), its generated modules, the client and tokens.

Nothing here imports the switch's data plane or pipeline: the host library uses
`switch.api.client` alone.
"""
