"""The handler families (DESIGN.md §6): importing ``handlers`` registers every one in ``handlers.base.REGISTRY``.

Where it sits: dispatch imports this package and asks ``REGISTRY.for_event`` which handlers to call; each
``HandlerSpec.history_key`` (None for the per-node families, a job key for ``nccl``) names the history.
"""

from handlers import ecc as ecc
from handlers import memleak as memleak
from handlers import nccl as nccl
from handlers import xid as xid

__all__ = ["ecc", "memleak", "nccl", "xid"]
