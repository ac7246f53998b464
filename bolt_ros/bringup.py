"""python -m bolt_ros.bringup [--config PATH] [--console] [name:=value ...]

Runs the assistant graph (bolt_ros.graph: the same description launch/assistant.launch.py uses) in this one
process on one single-threaded executor (no callback blocks; see nodes/common.spin_nodes).
The `name:=value` pairs are the launch arguments. One SIGINT (Ctrl-C) ends
everything: rclpy's handler shuts the context down and the bounded spin loop sees it within 0.1 s.
"""
from __future__ import annotations

import argparse
import sys
import threading

import rclpy

from bolt_ros.graph import describe_graph, instantiate, launch_arguments, parse_arguments
from bolt_ros.nodes.stop_signal import stop_on_sigint


def parse(argv: list[str]) -> tuple[dict[str, str], bool]:
    ap = argparse.ArgumentParser(prog="python -m bolt_ros.bringup", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="launch arguments (name:=value): " + ", ".join(
                                     f"{k} (default {v!r})" for k, v in launch_arguments().items()))
    ap.add_argument("--config", help="assistant parameters file (default: the package's config/assistant.yaml)")
    ap.add_argument("--console", action="store_true", help="type utterances, watch speech, tools and motion")
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
    return pairs, ns.console


def main(argv: list[str] | None = None) -> int:
    pairs, console = parse(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_arguments(pairs)
        args = _voice_devices_or_text(args, console)
        procs = describe_graph(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    stop_on_sigint(stop)  # before rclpy.init: its handler chains to this one
    rclpy.init(args=[])
    from bolt_ros.nodes.common import spin_nodes  # after init: imports rclpy node machinery

    nodes = []
    try:
        for p in procs:
            nodes += instantiate(p, namespace=args.namespace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        for n in nodes:
            n.destroy_node()
        rclpy.try_shutdown()
        return 2
    if console:
        from bolt_ros.console import Console
        con = Console(namespace=args.namespace)
        nodes.append(con)
        con.start_input(stop)
    print(f"bringup: {len(nodes)} nodes running ({', '.join(n.get_name() for n in nodes)}); Ctrl-C to stop",
          file=sys.stderr, flush=True)
    try:
        spin_nodes(nodes, stop=stop)
    finally:
        rclpy.try_shutdown()
    print("bringup: stopped", file=sys.stderr, flush=True)
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
