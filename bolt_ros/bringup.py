"""python -m bolt_ros.bringup [--config PATH] [--console [--verbose]] [name:=value ...]

Runs the assistant graph (bolt_ros.graph: the same description launch/assistant.launch.py uses) in this one
process on one single-threaded executor (no callback blocks; see nodes/common.spin_nodes).
The `name:=value` pairs are the launch arguments. One SIGINT (Ctrl-C) ends
everything: rclpy's handler shuts the context down and the bounded spin loop sees it within 0.1 s.

With --console the terminal is the conversation: the ROS logs (everything written to stderr, rcutils' too) go to
a log file whose path is printed at start; --verbose keeps them, and the tools' JSON, on the terminal.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import rclpy

from bolt_ros.graph import describe_graph, instantiate, launch_arguments, parse_arguments
from bolt_ros.nodes.stop_signal import stop_on_sigint


def parse(argv: list[str]) -> tuple[dict[str, str], bool, bool]:
    """(launch arguments, --console, --verbose)"""
    ap = argparse.ArgumentParser(prog="python -m bolt_ros.bringup", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="launch arguments (name:=value): " + ", ".join(
                                     f"{k} (default {v!r})" for k, v in launch_arguments().items()))
    ap.add_argument("--config", help="assistant parameters file (default: the package's config/assistant.yaml)")
    ap.add_argument("--console", action="store_true", help="type utterances, watch speech, tools and motion")
    ap.add_argument("--verbose", action="store_true", help="with --console: ROS logs and tool JSON on the terminal "
                    "too (else they go to a log file)")
    ap.add_argument("pairs", nargs="*", metavar="name:=value")
    ns = ap.parse_args(argv)
    pairs: dict[str, str] = {}
    for p in ns.pairs:
        name, sep, value = p.partition(":=")
        if not sep or name not in launch_arguments():
            ap.error(f"expected name:=value with name one of {', '.join(launch_arguments())}, got {p!r}")
        pairs[name] = value
    if ns.config:
        pairs["config"] = ns.config
    return pairs, ns.console, ns.verbose


def log_to_file() -> Path:
    """Send this process's stderr (Python's and rcutils' ROS log output, which is written to fd 2) to a new log
    file; the terminal keeps stdout (the console). Returns the file's path."""
    folder = Path(os.environ.get("ROS_LOG_DIR") or Path.home() / ".ros" / "log")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bolt_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    return path


def main(argv: list[str] | None = None) -> int:
    pairs, console, verbose = parse(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_arguments(pairs)
        args = _voice_devices_or_text(args, console)
        procs = describe_graph(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    terminal = sys.stderr  # the words for the person (voice, start, stop): on the terminal in either mode
    if console and not verbose:
        terminal = os.fdopen(os.dup(2), "w", buffering=1)
        print(f"bringup: logs in {log_to_file()} (--verbose shows them here)", file=terminal, flush=True)
    stop = threading.Event()
    stop_on_sigint(stop)  # before rclpy.init: its handler chains to this one
    rclpy.init(args=[])
    from bolt_ros.nodes.common import spin_nodes  # after init: imports rclpy node machinery

    nodes = []
    try:
        for p in procs:
            nodes += instantiate(p, namespace=args.namespace)
    except ValueError as e:
        print(f"error: {e}", file=terminal, flush=True)
        for n in nodes:
            n.destroy_node()
        rclpy.try_shutdown()
        return 2
    if console:
        from bolt_ros.console import Console
        con = Console(namespace=args.namespace, verbose=verbose)
        nodes.append(con)
    print(f"bringup: {len(nodes)} nodes running ({', '.join(n.get_name() for n in nodes)}); Ctrl-C to stop",
          file=terminal, flush=True)
    if console:
        con.start_input(stop)  # after that line: the console owns the terminal's last line (its prompt) from here
    try:
        spin_nodes(nodes, stop=stop)
    finally:
        rclpy.try_shutdown()
    print("bringup: stopped", file=terminal, flush=True)
    return 0


def _voice_devices_or_text(args, console: bool):
    """voice:=true with audio:=device needs a microphone and a speaker: without them, say so and keep to text (with
    --console), or stop (without it, there would be no way to talk at all)."""
    if not (args.voice and args.audio == "device"):
        return args
    from bolt_ros.voice.devices import DeviceError, check_device
    try:
        names = check_device("input"), check_device("output")
    except DeviceError as e:
        if not console:
            raise ValueError(f"voice:=true: {e}") from None
        print(f"voice: {e}\nvoice: off; type to the robot instead", file=sys.stderr, flush=True)
        return args.model_copy(update={"voice": False})
    print(f"voice: microphone {names[0]!r}, speaker {names[1]!r}", file=sys.stderr, flush=True)
    return args


if __name__ == "__main__":
    raise SystemExit(main())
