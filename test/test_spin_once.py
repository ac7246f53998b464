"""The spin loop outlives rclpy's half-built action client (bolt_ros.nodes.common.spin_once).

rclpy's ActionClient joins its node's waitables before it sets its `_lock`; a CI run met one in that state from a
spinning thread, the thread died and the test timed out. The state is made here on purpose, with real rclpy types:
a client whose `_lock` is not there yet."""
from __future__ import annotations

import threading

import pytest


def test_a_client_without_its_lock_yet_does_not_end_the_spin_loop():
    import rclpy
    from bolt_ros.action import Converse
    from rclpy.action import ActionClient
    from rclpy.executors import SingleThreadedExecutor

    from bolt_ros.nodes.common import spin_once

    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("half_built_client", context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        client = ActionClient(node, Converse, "converse")
        lock = client._lock
        del client._lock                        # as between add_waitable and `self._lock = ...` in __init__
        with pytest.raises(AttributeError, match="_lock"):
            executor.spin_once(timeout_sec=0.01)    # the negative control: rclpy's own spin_once dies on it
        spin_once(executor, 0.01)               # ours goes on
        client._lock = lock                     # __init__ finished
        spin_once(executor, 0.01)
        assert isinstance(client._lock, type(threading.Lock()))
        with pytest.raises(AttributeError, match="other"):   # any other AttributeError is a bug, and raised
            spin_once(_Raising(AttributeError("'X' object has no attribute 'other'")), 0.01)
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


class _Raising:
    def __init__(self, error: Exception):
        self.error = error

    def spin_once(self, timeout_sec: float) -> None:
        raise self.error
