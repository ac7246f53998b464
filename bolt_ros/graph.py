"""The one description of the assistant graph: which processes run which nodes with which parameters.

`launch/assistant.launch.py` turns it into launch_ros Node actions (one OS process per entry);
`python -m bolt_ros.bringup` instantiates the same entries in one process on one single-threaded executor. Each
entry's parameters go to every node of its process (launch_ros applies a `parameters=[dict]` to all of them).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from bolt_ros.assistant.config import from_ros_parameters, load_params_file, to_ros_parameters

PACKAGE = "bolt_ros"
ASSISTANT_NODE = "assistant_node"


class GraphArgs(BaseModel):
    """The launch arguments (`name:=value`); strings as launch gives them, parsed here."""
    model_config = ConfigDict(extra="forbid")
    config: str = ""            # assistant parameters file; "" = the package's config/assistant.yaml
    robot_config: str = ""      # simulated robot (limits, animations); "" = the package's config/robot.yaml
    model_path: str = ""        # overrides backend.model_path ("" = keep the config's)
    draft_path: str = ""        # overrides backend.draft_path (auto | none | a GGUF)
    # overrides backend.words_model_path: the spoken replies' model (qwen2.5-coder-1.5b: larger machines)
    words_model_path: str = ""
    backend: str = ""           # overrides backend.kind: embedded | openai | scripted
    base_url: str = ""          # overrides backend.base_url (openai)
    device: str = ""            # overrides backend.device (embedded): auto | cpu | cuda | cuda:N
    use_sim_robot: bool = True  # start the robot node chosen by `robot`
    robot: Literal["sim", "reachy_mini_sim", "reachy_mini"] = "sim"  # ours | Reachy Mini in MuJoCo | a real one
    host: str = ""              # reachy_mini: the daemon, host[:port] ("" = reachy-mini.local:8000); sim: :port
    use_caption_bridge: bool = True
    namespace: str = ""
    voice: bool = False         # speech_recognizer + speech_synthesizer (docs/voice.md)
    voice_config: str = ""      # voice parameters file; "" = the package's config/voice.yaml
    # voice: device (the laptop's mic and speaker) | topic (a robot's audio/in, audio/out) | auto: topic when the
    # voice config reads a WAV file (speech_recognizer source: wav), else device
    audio: str = "auto"

    @model_validator(mode="after")
    def _audio_for_the_voice_config(self) -> GraphArgs:
        """auto -> device or topic. A voice config that names a WAV file is the input as written: `voice:=true
        voice_config:=my_voice.yaml` runs it (the default used to be device, whose microphone replaced the WAV, and
        without a microphone voice was turned off: issue 33)."""
        if self.audio == "auto":
            self.audio = "topic" if self.voice and _voice_source(self.voice_config) == "wav" else "device"
        return self


@dataclass(frozen=True)
class ProcessSpec:
    name: str                  # label of the process
    executable: str            # in lib/bolt_ros, for launch_ros
    factory: str               # "module:attr" -> Node class or function returning nodes, called with node kwargs
    parameters: dict[str, Any] = field(default_factory=dict)


def launch_arguments() -> dict[str, str]:
    """Name -> default text of every launch argument (the launch file declares exactly these)."""
    return {name: _text(f.default) for name, f in GraphArgs.model_fields.items()}


def parse_arguments(pairs: dict[str, str]) -> GraphArgs:
    try:
        return GraphArgs.model_validate(pairs)
    except ValidationError as e:
        raise ValueError(f"bad launch arguments: {e}") from None


def describe_graph(args: GraphArgs) -> list[ProcessSpec]:
    """The processes of the graph; the assistant's parameters are validated here, so a bad config fails early."""
    config = Path(args.config) if args.config else package_file("config/assistant.yaml")
    params = load_params_file(config, ASSISTANT_NODE)
    overrides = {"backend.kind": args.backend, "backend.model_path": args.model_path,
                 "backend.draft_path": args.draft_path, "backend.base_url": args.base_url,
                 "backend.device": args.device, "backend.words_model_path": args.words_model_path}
    params.update({k: v for k, v in overrides.items() if v})
    try:
        params = to_ros_parameters(from_ros_parameters(params))  # complete and checked
    except ValidationError as e:
        raise ValueError(f"{config}: invalid assistant parameters:\n{e}") from None
    procs = [ProcessSpec("assistant", "assistant_node", "bolt_ros.nodes.assistant_node:make_nodes", params)]
    if args.use_sim_robot:
        procs.append(robot_process(args))
    if args.use_caption_bridge:
        procs.append(ProcessSpec("caption_bridge", "caption_bridge", "bolt_ros.nodes.caption_bridge:CaptionBridge"))
    if args.voice:
        from bolt_ros.nodes.speech_common import voice_parameters
        voice_config = args.voice_config or package_file("config/voice.yaml")
        for node, params in voice_parameters(voice_config, args.audio).items():
            if node == "speech_motion" and args.robot_config:  # the sway keeps inside this robot's joint limits
                params["robot_config"] = args.robot_config
            procs.append(ProcessSpec(node, node, f"bolt_ros.nodes.{node}:make_nodes", params))
    return procs


def robot_process(args: GraphArgs) -> ProcessSpec:
    """The robot's process for `robot:=` (also launch/gazebo.launch.py's)."""
    robot = args.robot_config or str(package_file("config/robot.yaml"))
    if args.robot == "sim":
        return ProcessSpec("sim_robot", "sim_robot", "bolt_ros.nodes.sim_robot_nodes:make_sim_robot_nodes",
                           {"robot_config": robot})
    params: dict[str, Any] = {"robot_config": robot, "mode": "sim" if args.robot == "reachy_mini_sim" else "real"}
    host, _, port = args.host.rpartition(":") if ":" in args.host else (args.host, "", "")
    if host:
        params["host"] = host
    if port:
        params["port"] = int(port)
    return ProcessSpec("reachy_mini", "reachy_mini", "bolt_ros.nodes.reachy_mini_nodes:make_reachy_mini_nodes", params)


def instantiate(spec: ProcessSpec, **node_kwargs) -> list:
    """Create the nodes of one process entry in this process (bringup); node_kwargs: context, namespace, ..."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    module, _, attr = spec.factory.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"process {spec.name}: cannot load {spec.factory}: {e}") from e
    overrides = [Parameter(k, value=v) for k, v in spec.parameters.items()]
    made = factory(parameter_overrides=overrides, **node_kwargs)
    nodes = [made] if isinstance(made, Node) else list(made)
    return nodes


def package_file(rel: str) -> Path:
    """A file of the package: the source checkout first (live edits), then the installed share directory."""
    src = Path(__file__).resolve().parent.parent / rel
    if src.exists():
        return src
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory(PACKAGE)) / rel
    except (ImportError, LookupError) as e:
        raise FileNotFoundError(f"cannot find {rel} of package {PACKAGE}: {e}") from e


def _voice_source(voice_config: str) -> str:
    """speech_recognizer's `source` in a voice parameters file ("" = the package's); "" when it cannot be read (the
    graph's description then says why)."""
    try:
        path = voice_config or package_file("config/voice.yaml")
        return str(load_params_file(path, "speech_recognizer").get("source", ""))
    except (OSError, ValueError):
        return ""


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
