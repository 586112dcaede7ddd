"""The handler families (DESIGN.md §6) and the registry built from their policies.

Where it sits: below dispatch, above the contracts. Importing the package registers nothing: each family
module (``xid``, ``ecc``, ``nccl``, ``memleak``) declares a ``DEFINITION`` and keeps ``decide(event, history,
now, policy)`` a pure function; ``build_registry(HandlerPolicies...)`` binds every definition to its policy
(the service from its settings, ``HandlerPolicies.from_settings``), ``default_registry()`` does so with the
defaults. Dispatch asks the registry's ``for_event`` which handlers to call; each ``HandlerSpec.history_key``
(None for the per-node families, a job key for ``nccl``) names the history.
"""

from handlers import ecc as ecc
from handlers import memleak as memleak
from handlers import nccl as nccl
from handlers import xid as xid
from handlers.registry import FAMILIES, HandlerPolicies, build_registry, default_registry

__all__ = ["FAMILIES", "HandlerPolicies", "build_registry", "default_registry", "ecc", "memleak", "nccl", "xid"]
