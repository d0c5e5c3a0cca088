"""Ring setup: rendezvous (TCP store), rxe device/GID discovery, RC QP rings, RingSpec.

`ring_setup.verbs.host` (pyverbs) is imported only where a real device is opened.
"""
