"""Ctrl-C as a request to stop, not an exception: the first SIGINT sets an event the spin loop checks.

Python turns SIGINT into a KeyboardInterrupt raised at whatever bytecode the main thread runs, and rclpy's own
handler chains to Python's. Raised inside rclpy (a Task half-built in `Future.__init__`, a message take under way)
it left half-made objects whose `__del__` printed a traceback at exit (the Reachy Mini bringup's SIGINT test, once
in a clean-clone CI run on 2026-12-03; it passed in the runs before and after), and a take's RuntimeError once
before. With the event, the spin loop ends between callbacks. A second SIGINT raises KeyboardInterrupt as usual, for
a shutdown that hangs.

Install it before `rclpy.init`, whose handler then chains to this one (installed after, it would replace rclpy's).
"""
from __future__ import annotations

import signal
import threading


def stop_on_sigint(stop: threading.Event) -> None:
    """The next SIGINT sets `stop` (main thread only, as for any Python signal handler); the one after it raises."""

    def first(signum, frame) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, first)
