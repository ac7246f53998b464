"""The assistant graph in one process, for the graph benches (bench_graph.py, soak.py): bringup's layout, i.e. the
simulated robot and the assistant on one SingleThreadedExecutor spun by a background thread, plus a probe node
that publishes utterances on speech/transcript and sees the assistant's idle state on assistant/events.
"""
from __future__ import annotations

import statistics
import threading
import time

import rclpy
from bolt_ros.msg import AssistantEvent
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import String

from bolt_ros.assistant.config import AssistantConfig, from_ros_parameters, load_params_file
from bolt_ros.graph import package_file
from bolt_ros.nodes.assistant_node import AssistantNode
from bolt_ros.nodes.common import tune_interpreter
from bolt_ros.nodes.sim_robot_nodes import make_sim_robot_nodes


def percentiles(xs) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    q = lambda p: xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]  # noqa: E731
    return {"n": len(xs), "p50": q(50), "p99": q(99), "max": xs[-1], "mean": statistics.fmean(xs)}


def product_config(extra_tools: str = "", **updates) -> AssistantConfig:
    """config/assistant.yaml (what bringup runs), with extra tools appended and parameters overridden."""
    params = load_params_file(package_file("config/assistant.yaml"), "assistant_node")
    params["tools"] += extra_tools
    return from_ros_parameters({**params, **updates})


class Graph:
    """One rclpy context (its own domain participant) with the robot's nodes (unless sim_robot=False: the robot
    runs elsewhere), the assistant on `backend` (None: the one its config names) and the probe, spinning."""

    def __init__(self, config: AssistantConfig, backend=None, *, domain_id: int, sim_robot: bool = True):
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.robot_nodes = make_sim_robot_nodes(context=self.context) if sim_robot else []
        self.assistant = AssistantNode(config, backend=backend, context=self.context)
        self.probe = rclpy.create_node("bench_probe", context=self.context)
        self.idle = threading.Event()
        self.probe.create_subscription(AssistantEvent, config.topics.events, self._on_event, 100)
        self.say_pub = self.probe.create_publisher(String, config.topics.transcript, 10)
        tune_interpreter()  # as spin_nodes does
        self.executor = SingleThreadedExecutor(context=self.context)
        for n in [*self.robot_nodes, self.assistant, self.probe]:
            self.executor.add_node(n)
        self._stop = threading.Event()
        self._spinner = threading.Thread(target=self._spin, name="bench-spinner", daemon=True)
        self._spinner.start()

    def _spin(self) -> None:
        from bolt_ros.nodes.common import spin_once  # the benches build action clients on the spun probe
        while not self._stop.is_set():
            spin_once(self.executor, 0.05)

    def _on_event(self, m: AssistantEvent) -> None:
        if m.type == AssistantEvent.STATE and m.state == "idle":
            self.idle.set()

    def say(self, text: str) -> None:
        self.say_pub.publish(String(data=text))

    def wait_connected(self, tools: tuple[str, ...] = (), timeout: float = 30.0) -> None:
        """Until the assistant hears the probe and the action servers of `tools` are up (discovery is async)."""
        clients = self.assistant.router._clients
        deadline = time.monotonic() + timeout
        while not (self.say_pub.get_subscription_count() and all(clients[t].server_is_ready() for t in tools)):
            if time.monotonic() > deadline:
                raise SystemExit("graph did not connect")
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._spinner.join(2)
        nodes = [*self.robot_nodes, self.assistant]
        for n in nodes:
            getattr(n, "close", lambda: None)()  # the nodes' own loops (running goals) end before the executor
        self.executor.shutdown(2)
        for n in [*nodes, self.probe]:
            n.destroy_node()
        rclpy.try_shutdown(context=self.context)
