"""`ddpkit port`: rewrite a plain single-device PyTorch script into a ddpkit script (libcst, format-preserving)."""

from __future__ import annotations

from ddpkit.port.command import main
from ddpkit.port.codemod import PortBug, PortError, PortResult, Todo, port_source

__all__ = ["PortBug", "PortError", "PortResult", "Todo", "main", "port_source"]
