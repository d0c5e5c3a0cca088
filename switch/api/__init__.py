"""The controller's typed API: control.proto and its generated modules, the client and token
files (which import no other switch code: the host library loads only these), and the
server's request checks (validate.py).
"""
