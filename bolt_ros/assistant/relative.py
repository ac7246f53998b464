"""A move from where the robot is now ("a bit more to the right", "a little higher", "all the way left"), ROS-free.

A person who asked for a look to the right and then says "a bit more" expects more turn, not the same fixed look
again (issue 34: "A bit more to the right." played look_right once more, "Okay, right it is."). A tool with
`relative` (config/assistant.yaml: `move_head` with `direction` and `amount`) moves one joint on from its measured
position (the robot's `joint_states`) by the amount's step, in the direction's sign, and keeps every other joint where
it is (NaN in a GotoPose target: the motion server keeps that joint). The target is checked against the robot's
joint limits less a margin before anything is sent: past them the step stops at the limit and the robot says so
("That's as far as I can turn."); already there, nothing is sent and it says why in plain words (AT_LIMIT, through
tools.failure_line). On the Reachy Mini the motion server then checks the pose against the platform's reach
(robot/reachy_mini/reach.py) as it does for every goal.
"""
from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

MOVED, TO_LIMIT = "moved", "to_limit"
# the plain reason a relative move already at its limit fails with (tools.failure_line says AT_LIMIT for it)
AT_LIMIT_CUE = "already as far as it goes"


class RelativeMove(BaseModel):
    """A tool argument that names a direction moves one joint from its current position (see the module doc)."""
    model_config = ConfigDict(extra="forbid")
    parameter: str = "direction"          # the string enum argument: which way
    amount: str = "amount"                # the string enum argument: how far (optional; default_amount without it)
    joints: dict[str, tuple[str, float]]  # direction -> (joint, sign): "left": [head_yaw, 1]
    steps: dict[str, float]               # amount -> radians; 0 = as far as the limit allows ("all the way")
    default_amount: str = "more"
    otherwise_required: list[str] = Field(default_factory=list)  # the arguments a call without a direction needs
    field: str = "target.{joint}"         # the goal field of a joint
    # goal fields set NaN (that joint kept where it is) unless moved; "target.antennas[2]": an array of 2 NaNs
    keep: list[str] = Field(default_factory=list)
    margin: float = Field(0.05, ge=0.0)   # radians kept inside each limit
    state_topic: str = "joint_states"     # sensor_msgs/JointState: the joints' measured positions
    say: list[str] = Field(default_factory=list)           # lines for a step done ({direction}, {amount})
    say_at_limit: list[str] = Field(default_factory=list)  # lines for a step that stopped at the limit
    done: str = "you turned your head further {direction}"

    @model_validator(mode="after")
    def _default_is_a_step(self) -> RelativeMove:
        if self.default_amount not in self.steps:
            raise ValueError(f"relative.default_amount {self.default_amount!r} is not a step: {list(self.steps)}")
        if any(s < 0 or not math.isfinite(s) for s in self.steps.values()):
            raise ValueError("relative.steps must be finite and >= 0 (0: as far as the limit allows)")
        return self

    def applies(self, args: dict) -> bool:
        """The call names a direction: a relative move (else the tool's own goal mapping applies)."""
        return args.get(self.parameter) is not None


class RelativeError(ValueError):
    """The move cannot be made from here (the message is the plain reason)."""


def plan_relative(rel: RelativeMove, args: dict, current: dict[str, float],
                  limits: dict[str, tuple[float, float]]) -> tuple[dict[str, float], str, dict]:
    """(goal fields of the joints, MOVED or TO_LIMIT, the values the lines are filled from); RelativeError when the
    joint's position is unknown or it is already at its limit that way."""
    direction = args[rel.parameter]
    if direction not in rel.joints:
        raise RelativeError(f"no relative move {direction!r}; one of {', '.join(rel.joints)}")
    joint, sign = rel.joints[direction]
    amount = args.get(rel.amount) or rel.default_amount
    if amount not in rel.steps:
        raise RelativeError(f"no amount {amount!r}; one of {', '.join(rel.steps)}")
    if joint not in current or not math.isfinite(current[joint]):
        raise RelativeError(f"the position of {joint} is not available (no {rel.state_topic} yet)")
    if joint not in limits:
        raise RelativeError(f"no limits known for {joint}")
    lower, upper = limits[joint][0] + rel.margin, limits[joint][1] - rel.margin
    bound = upper if sign > 0 else lower
    here = current[joint]
    room = (bound - here) * (1 if sign > 0 else -1)  # how far it may still go that way
    if room <= 0.01:  # ~0.6 deg: nothing a person would see
        raise RelativeError(f"{joint} is {AT_LIMIT_CUE} {direction} ({here:.3f} rad, limit {bound:.3f})")
    step = rel.steps[amount]
    how = MOVED
    if step == 0 or step >= room:
        step, how = room, TO_LIMIT
    target = here + math.copysign(step, sign)
    fields: dict = {}
    for path in rel.keep:
        m = re.fullmatch(r"(.+)\[(\d+)\]", path)
        fields[m[1] if m else path] = [math.nan] * int(m[2]) if m else math.nan
    fields[rel.field.format(joint=joint)] = target
    return fields, how, {rel.parameter: direction, rel.amount: amount}
