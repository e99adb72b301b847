"""Your own network: a torso written in flax, named "MODULE:ATTR" so that a run records it by reference.

    # mymodule.py (importable: on sys.path)
    class Torso(nn.Module):                     # or any zero-argument function returning a linen Module
        @nn.compact
        def __call__(self, obs):                # obs [batch, *obs_shape] -> features [batch, F]
            return nn.relu(nn.Dense(128)(obs.reshape(obs.shape[0], -1)))

    sparqrl.train("ppo", "CartPole-v1", steps=..., network=mymodule.Torso)   # or network="mymodule:Torso"

The algorithm puts its own heads on the torso's features (policy logits or Gaussian mean, value, Q-values;
TD3 and SAC their MLPs of `hidden`). A run's config.json holds the name, never the object (nothing is
pickled): `load`, `resume` and `eval` import MODULE again, and since a run folder is data, only when the
command names that module too (`sparqrl.trust`); `export` refuses such a run (it writes built-in layouts
only). `check` runs the factory once on a dummy observation before anything is compiled: what it returns
must be a linen Module whose output is [batch, features] floats, else a one-line `ConfigError` naming the
field.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.config import REFERENCE_FORM as FORM, check_reference, fail, require

TORSO_NAMES = ("Torso_0", "Torso_1")
"""The parameter names of a user's torso as the actor's (or the only network's) and as the critic's, numbered as
the built-in torsos are, so the sparse groups (`algos.sparsify`) and the actor branch find them alike."""


def name_for(field: str, obj: Any) -> str | None:
    """The MODULE:ATTR name a run records for `obj`: a name as it is; a callable by its module and qualified
    name, if a new process imports that very object back from there (not a lambda, a local function or
    `__main__`'s). Nothing is pickled."""
    if obj is None or isinstance(obj, str):
        check_reference(field, obj)
        return obj
    require(callable(obj), field, repr(obj), f"must be a callable returning a flax Module, as {FORM}")
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    spec = f"{module}:{qualname}"
    require(module not in (None, "__main__") and "<" not in qualname and _resolve(spec, field, quiet=True) is obj,
            field, repr(obj), f"must be defined at the top level of an importable module (run folders record it "
                              f"by name, {FORM}), not in __main__ nor inside a function")
    return spec


def _resolve(spec: str, field: str, quiet: bool = False) -> Any:
    """The object MODULE:ATTR names (imported); with `quiet`, None where it cannot be imported."""
    module, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as error:  # noqa: BLE001 - the user's module raised, or has no such attribute
        if quiet:
            return None
        fail(field, spec, f"cannot be imported ({type(error).__name__}: {error}; add the folder that holds "
                          "the module to PYTHONPATH)")
    return obj


def build(spec: str, field: str = "network") -> nn.Module:
    """A new torso from the factory `spec` names: a linen Module (checked)."""
    check_reference(field, spec)
    factory = _resolve(spec, field)
    require(callable(factory), field, spec, f"must name a callable returning a flax Module ({FORM})")
    try:
        module = factory()
    except Exception as error:  # noqa: BLE001 - the user's factory raised
        fail(field, spec, f"must return a flax Module when called with no arguments ({type(error).__name__}: {error})")
    require(isinstance(module, nn.Module), field, spec,
            f"must return a flax linen Module (returned {type(module).__name__})")
    return module


@functools.lru_cache(maxsize=64)
def check(spec: str, obs_shape: tuple[int, ...], field: str = "network") -> int:
    """The feature count F of the torso `spec` names, checked on shapes before anything is compiled: initialised
    (abstractly) on a dummy observation [2, *obs_shape], its output must be floats [2, F]."""
    module = build(spec, field)
    obs = jnp.zeros((2, *obs_shape), jnp.float32)
    try:
        out = jax.eval_shape(lambda: module.init_with_output(jax.random.PRNGKey(0), obs)[0])
    except Exception as error:  # noqa: BLE001 - the user's module failed on the observation
        fail(field, spec, f"must map observations [batch, *{obs_shape}] to features [batch, F] "
                          f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
    ok = isinstance(out, jax.ShapeDtypeStruct) and len(out.shape) == 2 and out.shape[0] == 2 and out.shape[1] > 0
    shape = getattr(out, "shape", type(out).__name__)
    require(ok and jnp.issubdtype(out.dtype, jnp.floating), field, spec,
            f"must return features [batch, F] of floats for observations [batch, *{obs_shape}]; for [2, "
            f"*{obs_shape}] it returned {shape} of {getattr(out, 'dtype', type(out).__name__)}")
    return int(out.shape[1])


class UserTorso(nn.Module):
    """The torso `spec` names, on observations [..., *obs_shape] or flattened ones [..., prod(obs_shape)] (what
    actors pass): the user's module always sees [batch, *obs_shape], any leading axes folded into one."""

    spec: str
    obs_shape: tuple[int, ...]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        ndim = len(self.obs_shape)
        flat = tuple(x.shape[x.ndim - ndim:]) != tuple(self.obs_shape)
        batch = x.shape[:-1] if flat else x.shape[:x.ndim - ndim]
        out = build(self.spec)(x.reshape((int(np.prod(batch, dtype=np.int64)), *self.obs_shape)))
        return out.reshape(batch + out.shape[-1:])


def check_torsos(config: Any, obs_shape: tuple[int, ...], networks: tuple[str, ...]) -> None:
    """`check` of each torso an algorithm config names for its `networks` ('actor', 'critic'; '' for its one
    network: `AlgoConfig.network_of`), the error naming the field that named it."""
    for network in networks:
        spec = config.network_of(network)
        if spec is not None:
            own = network and getattr(config, f"{network}_network") is not None
            check(spec, tuple(obs_shape), f"{network}_network" if own else "network")
