"""Republish plain-text captions (std_msgs/String from any VLM node) as bolt_ros/Caption on `perception/caption`."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from rclpy.node import Node
from std_msgs.msg import String

from bolt_ros.msg import Caption
from bolt_ros.nodes.common import declare_config, run_nodes


class CaptionBridgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_topic: str = "perception/caption_text"
    output_topic: str = "perception/caption"
    source: str = "vlm"  # Caption.source of what this bridge publishes
    frame_id: str = "camera_link"
    confidence: float = Field(-1.0, ge=-1.0, le=1.0)  # -1: the producer gives none
    max_chars: int = Field(2000, ge=1)  # longer captions are cut (a runaway VLM must not flood the prompt)


class CaptionBridge(Node):
    def __init__(self, config: CaptionBridgeConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "caption_bridge"), **node_kwargs)
        self.config = declare_config(self, config or CaptionBridgeConfig())
        self._pub = self.create_publisher(Caption, self.config.output_topic, 10)
        self._sub = self.create_subscription(String, self.config.input_topic, self._on_text, 10)

    def _on_text(self, msg: String) -> None:
        text = " ".join(msg.data.split())  # VLMs emit newlines and runs of spaces; one line reads better in a prompt
        if not text:
            self.get_logger().debug("ignoring an empty caption")
            return
        if len(text) > self.config.max_chars:
            self.get_logger().warning(f"caption of {len(text)} chars cut to {self.config.max_chars}")
            text = text[: self.config.max_chars]
        out = Caption(source=self.config.source, text=text, confidence=self.config.confidence)
        out.header.stamp = self.get_clock().now().to_msg()
        out.header.frame_id = self.config.frame_id
        self._pub.publish(out)


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(lambda: [CaptionBridge()], args))


if __name__ == "__main__":
    main()
