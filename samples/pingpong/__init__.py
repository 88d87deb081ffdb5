"""The ping/pong sample: the smallest conversation between two nodes."""

from samples.pingpong.flows import PingFlow, PongFlow

__all__ = ["PingFlow", "PongFlow"]
