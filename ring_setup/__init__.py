"""Ring setup: rendezvous (TCP store), rxe device/GID discovery, RC QP rings, RingSpec.

`ring_setup.verbs` (pyverbs) is imported only where a real device is opened.
"""
