"""Flow control over one QP ring: message plan, credit window, flow-controlled stream.

`ring_setup.verbs.verbs_link` (pyverbs) is imported only where a real `Link` is built.
"""
from flowctl.link import Completion, Link, LocalBuffer, RemoteBuffer
from flowctl.plan import FlowConfig, Message, MessagePlan
from flowctl.stream import (CompletionError, FlowError, Outgoing, SequenceError, StallError,
                            Stream)
from flowctl.window import CreditWindow, WindowError

__all__ = ["Completion", "CompletionError", "CreditWindow", "FlowConfig", "FlowError", "Link",
           "LocalBuffer", "Message", "MessagePlan", "Outgoing", "RemoteBuffer", "SequenceError",
           "StallError", "Stream", "WindowError"]
