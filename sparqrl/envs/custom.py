"""Your own environment: a Gymnasium env on the host, or a JAX env on the device, named so that a new
process (`sparqrl eval`, `train --resume`, `sparqrl.load`) can rebuild it.

Names (what `--env` takes and what a run's config.json records):

    gym:MODULE:Attr      Attr (in the importable MODULE) is a `gymnasium.Env` subclass or a zero-argument
                         factory returning one: stepped on the host (every algorithm)
    gym:MODULE:Id-v0     MODULE registers the Gymnasium id Id-v0 when imported (Gymnasium's own
                         "module:id" form); same as `--import MODULE --env gym:Id-v0`
    jax:MODULE:Attr      Attr is a JAX env on the device (all algorithms): an object following the `Env`
                         protocol (`sparqrl.envs.core`) or a gymnax `Environment` (instance, class or
                         zero-argument factory; a gymnax env runs with its `default_params`)

Attr may be dotted (`Outer.Inner`). Modules are imported from `sys.path` only: the current folder is never
added to it (set PYTHONPATH to import from a folder). A run's `imports` (`--import MODULE`) are imported before
its env is resolved, so ids that a module registers work too. A run folder is data: the modules its
config.json names are imported only when the command names them too (`sparqrl.trust`).

From Python, `sparqrl.train(algo, obj, ...)` takes the object itself: `name_for(obj)` names it `gym:`/`jax:`
MODULE:QUALNAME when a new process can import it back (a module-level class, function or instance, not in
`__main__`). Anything else (a lambda, a local class, an instance made on the fly) is kept in this process's
registry under a `gym:<local>:...` / `jax:<local>:...` name: it trains, and in a new process the name is a
one-line error asking for the object again (`sparqrl.load(DIR, env=obj)`), which `bind` registers.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from sparqrl.config import ConfigError, fail, require
from sparqrl.envs.core import HOST_PREFIX, Adapter, Box, Discrete, Space, StepOut

if TYPE_CHECKING:  # JAX is imported where a device env is built: the names are read (trust, help) without it
    import jax

DEVICE_PREFIX = "jax:"
LOCAL = "<local>"
"""The module part of names of objects that only this process holds (`name_for`)."""

_objects: dict[str, Any] = {}
"""This process's registry: name -> object, for objects a new process could not import (`name_for`)."""

HOST, DEVICE = "host", "device"


# ---------------------------------------------------------------------------------------------
# Names


def is_custom(name: str) -> bool:
    """A user's own environment: `jax:...`, or `gym:MODULE:ATTR` (a bare `gym:ID` is Gymnasium's registry)."""
    return name.startswith(DEVICE_PREFIX) or (name.startswith(HOST_PREFIX) and ":" in name[len(HOST_PREFIX):])


def is_local(name: str) -> bool:
    """A name of an object only the process that trained it holds (`name_for`)."""
    return name.startswith((f"{HOST_PREFIX}{LOCAL}:", f"{DEVICE_PREFIX}{LOCAL}:"))


def _split(name: str) -> tuple[str, str, str]:
    """(prefix, module, attr) of `gym:MODULE:ATTR` / `jax:MODULE:ATTR`; a malformed name is an error."""
    prefix = HOST_PREFIX if name.startswith(HOST_PREFIX) else DEVICE_PREFIX
    module, sep, attr = name[len(prefix):].partition(":")
    require(bool(sep and module and attr), "env", name,
            f"must look like {prefix}MODULE:ATTR (ATTR an object of the importable MODULE)")
    return prefix, module, attr


def _is_attr_path(attr: str) -> bool:
    return all(part.isidentifier() for part in attr.split("."))


def module_of(name: str | None) -> str | None:
    """The module a `gym:MODULE:ATTR` / `jax:MODULE:ATTR` env name imports; None for any other name (sparqrl's
    own envs, Gymnasium ids, a local object's name)."""
    if not isinstance(name, str) or not is_custom(name) or is_local(name):
        return None
    prefix = HOST_PREFIX if name.startswith(HOST_PREFIX) else DEVICE_PREFIX
    return name[len(prefix):].partition(":")[0] or None


def import_module(module: str, field: str = "imports", value: Any = None) -> Any:
    """Import a user's module from `sys.path` (never the current folder: see the module docstring); any
    failure is a one-line error naming `field`, `value` (default: the module), the module and the exception."""
    value = module if value is None else value
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        fail(field, value, f"module {module!r} cannot be imported ({type(error).__name__}: {error}; add the "
                           "folder that holds it to PYTHONPATH)")
    except Exception as error:  # noqa: BLE001 - the user's module raised while importing
        fail(field, value, f"module {module!r} cannot be imported ({type(error).__name__}: {error})")


def import_modules(modules: tuple[str, ...] | list[str]) -> None:
    """Import a run's `imports` (e.g. modules that register Gymnasium ids), in order."""
    for module in modules:
        require(isinstance(module, str) and bool(module), "imports", module, "must be a module name")
        import_module(module)


def resolve(name: str) -> Any:
    """The object a `gym:MODULE:ATTR` / `jax:MODULE:ATTR` name stands for (a local one: from the registry)."""
    if is_local(name):
        if name not in _objects:
            fail("env", name, "was a Python object given to sparqrl.train (a lambda, a local class or an instance "
                              "not defined at module level), which a new process cannot rebuild: pass it again "
                              "(sparqrl.load(DIR, env=obj)) or define it at module level of an importable module")
        return _objects[name]
    _, module, attr = _split(name)
    obj = import_module(module, "env", name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            fail("env", name, f"module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def name_for(obj: Any) -> str:
    """The sparqrl name of an env object (see the module docstring): importable, or registered locally."""
    kind = classify(obj, repr(obj))
    prefix = HOST_PREFIX if kind == HOST else DEVICE_PREFIX
    module, qualname = _importable_path(obj)
    if module is not None:
        return f"{prefix}{module}:{qualname}"
    what = getattr(obj, "__qualname__", None) or f"{type(obj).__qualname__}()"
    base = f"{prefix}{LOCAL}:{getattr(obj, '__module__', None) or type(obj).__module__}.{what}"
    name, n = base, 1
    while name in _objects and _objects[name] is not obj:  # another object of the same name
        n += 1
        name = f"{base}#{n}"
    _objects[name] = obj
    return name


def _importable_path(obj: Any) -> tuple[str | None, str]:
    """(module, attr path) under which a new process imports this very object, else (None, "")."""
    named = isinstance(obj, type) or (callable(obj) and hasattr(obj, "__qualname__"))  # a class or a function
    module = getattr(obj, "__module__", None) if named else None
    if module is not None:
        qualname = obj.__qualname__
        if module != "__main__" and "<" not in qualname and _resolves_to(module, qualname, obj):
            return module, qualname
        return None, ""
    module = type(obj).__module__  # an instance: a module-level variable of its class's module
    held = sys.modules.get(module)
    if module != "__main__" and held is not None:
        for attr, value in vars(held).items():
            if value is obj and attr.isidentifier():
                return module, attr
    return None, ""


def _resolves_to(module: str, qualname: str, obj: Any) -> bool:
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - not importable the same way: kept locally
        return False
    return found is obj


def bind(name: str, obj: Any) -> None:
    """Register `obj` under the local name a run recorded (`sparqrl.load(DIR, env=obj)` in a new process)."""
    require(is_local(name), "env", name, "is rebuilt by name; only a run of a local object takes env=obj")
    kind = classify(obj, repr(obj))
    require((kind == HOST) == name.startswith(HOST_PREFIX), "env", repr(obj),
            f"must be a {'Gymnasium' if name.startswith(HOST_PREFIX) else 'JAX'} environment like the run's ({name})")
    _objects[name] = obj


def program_key(name: str) -> str | None:
    """What identifies env `name`'s code in stored traced programs (`sparqrl.runners.programs`): the name
    itself for sparqrl's own envs; for a user's own, the name and a digest of the source files of its
    top-level package as now imported (an edited env must not reuse programs traced from its old code);
    None for a local object, whose code has no file to key on: its programs should not be stored."""
    if not is_custom(name):
        return name
    if is_local(name):
        return None
    import hashlib

    top = _split(name)[1].split(".")[0]
    digest = hashlib.sha256(name.encode())
    for module_name in sorted(m for m in sys.modules if m == top or m.startswith(top + ".")):
        file = getattr(sys.modules[module_name], "__file__", None)
        if file:
            try:
                digest.update(module_name.encode() + b"\0" + open(file, "rb").read())
            except OSError:
                return None
    return f"{name}@{digest.hexdigest()[:16]}"


# ---------------------------------------------------------------------------------------------
# What an object is


def _gymnax_environment() -> type:
    from gymnax.environments.environment import Environment

    return Environment


def _is_device_env(obj: Any) -> bool:
    """A gymnax Environment, or an object with the `Env` protocol's methods and attributes."""
    if isinstance(obj, _gymnax_environment()):
        return True
    return all(hasattr(obj, a) for a in ("reset", "step", "observation_shape", "action_space"))


class _NoGym:
    """Stands for gymnasium while nothing has imported it: then no object is a Gymnasium env."""

    class Env:
        pass


def classify(obj: Any, shown: str) -> str:
    """HOST for a gymnasium.Env class or factory, DEVICE for a JAX env (instance, class or factory)."""
    gym = sys.modules.get("gymnasium", _NoGym)  # a device run never imports Gymnasium itself

    supported = ("must be an environment name, a gymnasium.Env subclass or zero-argument factory (host), or a "
                 "JAX environment: an object with sparqrl's Env protocol (sparqrl.envs.Env) or a gymnax "
                 "Environment (instance, class or factory)")
    if isinstance(obj, type):
        if issubclass(obj, gym.Env):
            return HOST
        if issubclass(obj, _gymnax_environment()) or all(hasattr(obj, a) for a in ("reset", "step")):
            return DEVICE
        fail("env", shown, supported)
    if isinstance(obj, gym.Env):
        fail("env", shown, "is a Gymnasium env instance, which cannot be copied for the many environments a run "
                           "steps: pass its class or a zero-argument factory (e.g. lambda: MyEnv(size=5))")
    if _is_device_env(obj):
        return DEVICE
    if callable(obj):
        made = _call(obj, shown)
        gym = sys.modules.get("gymnasium", _NoGym)  # (the factory's module may import it only now)
        if isinstance(made, gym.Env):
            made.close()
            return HOST
        if _is_device_env(made):
            return DEVICE
        fail("env", shown, f"is a factory whose result ({type(made).__name__}) is neither a gymnasium.Env nor a JAX "
                           "environment (sparqrl's Env protocol or a gymnax Environment)")
    fail("env", shown, supported)


def _call(factory: Callable[[], Any], shown: str) -> Any:
    try:
        return factory()
    except Exception as error:  # noqa: BLE001 - the user's code: one line, not a traceback
        fail("env", shown, f"could not be built: calling it with no arguments raised {type(error).__name__}: {error}")


def host_factory(name: str) -> Callable[[], Any]:
    """A zero-argument callable building one Gymnasium env for `gym:MODULE:ATTR` (checked to be one)."""
    import gymnasium as gym

    _, module, attr = _split(name) if not is_local(name) else (None, None, "")
    if module is not None and not _is_attr_path(attr):  # gym:MODULE:Id-v0, registered by importing MODULE
        import_module(module, "env", name)
        require(attr in gym.registry, "env", name, f"module {module!r} did not register a Gymnasium id {attr!r}")
        return lambda: _call(lambda: gym.make(attr), name)
    obj = resolve(name)
    if classify(obj, name) != HOST:
        fail("env", name,
             f"is a JAX environment: name it {DEVICE_PREFIX}{name[len(HOST_PREFIX):]} (runs on the device)")

    def make() -> Any:
        env = _call(obj, name)
        require(isinstance(env, gym.Env), "env", name, f"must build a gymnasium.Env; it built {type(env).__name__}")
        return env

    return make


def resolve_name_only(name: str) -> None:
    """The checks of a name that need no env built: its module imports and has the attribute (or id)."""
    if name.startswith(HOST_PREFIX):
        _, module, attr = _split(name) if not is_local(name) else (None, None, "")
        if module is not None and not _is_attr_path(attr):
            import gymnasium as gym

            import_module(module, "env", name)
            require(attr in gym.registry, "env", name, f"module {module!r} did not register a Gymnasium id {attr!r}")
            return
    resolve(name)


# ---------------------------------------------------------------------------------------------
# JAX environments on the device


@dataclasses.dataclass(frozen=True, eq=False)
class UserEnv(Adapter):
    """A user's JAX env, checked (`device_env`), under its sparqrl name: observations as float32 (integer
    and boolean ones are cast), rewards float32, and `truncated` only where not `terminated`."""

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        import jax.numpy as jnp

        obs, state = self.env.reset(key)
        return jnp.asarray(obs).astype(jnp.float32), state

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepOut:
        import jax.numpy as jnp

        out = self.env.step(key, state, action)
        terminated = jnp.asarray(out.terminated, jnp.bool_)
        return out._replace(
            obs=jnp.asarray(out.obs).astype(jnp.float32),
            reward=jnp.asarray(out.reward, jnp.float32),
            terminated=terminated,
            truncated=jnp.asarray(out.truncated, jnp.bool_) & ~terminated,
            final_obs=jnp.asarray(out.final_obs).astype(jnp.float32),
        )


def _device_space(name: str, space: Any) -> Space:
    if isinstance(space, (Discrete, Box)):
        return space
    from gymnax.environments import spaces

    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return Box.make(space.low, space.high, tuple(space.shape))
    fail("env", name, f"has {type(space).__name__} actions ({space}); {ACTIONS_SUPPORTED}")


ACTIONS_SUPPORTED = "sparqrl supports Discrete actions (dqn, ppo) and Box actions (td3, sac, ppo)"


def device_env(name: str) -> UserEnv:
    """The `jax:` env `name`, checked by tracing one reset and one step (nothing compiled)."""
    obj = resolve(name)
    if classify(obj, name) != DEVICE:
        fail("env", name, f"is a Gymnasium environment: name it {HOST_PREFIX}{name[len(DEVICE_PREFIX):]} "
                          "(stepped on the host)")
    if isinstance(obj, type) or not _is_device_env(obj):
        obj = _call(obj, name)  # a class or a factory
    if isinstance(obj, _gymnax_environment()):
        from sparqrl.envs.gymnax_env import wrap_gymnax

        try:
            obj = wrap_gymnax(name, obj)
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's spaces or params
            fail("env", name, f"gymnax env's spaces could not be read ({type(error).__name__}: {error})")
    for attr in ("observation_shape", "action_space", "max_episode_steps"):
        require(hasattr(obj, attr), "env", name, f"has no {attr!r} attribute (the Env protocol: sparqrl.envs.Env)")
    shape = obj.observation_shape
    require(isinstance(shape, (tuple, list)) and all(isinstance(d, (int, np.integer)) and d > 0 for d in shape),
            "env", name, f"observation_shape={shape!r} must be a tuple of positive ints")
    steps = obj.max_episode_steps
    require(isinstance(steps, (int, np.integer)) and steps >= 1, "env", name,
            f"max_episode_steps={steps!r} must be an int >= 1 (evaluation runs that many steps)")
    env = UserEnv(name, obj, tuple(int(d) for d in shape), _device_space(name, obj.action_space), int(steps))
    _trace_once(env)
    return env


def _trace_once(env: UserEnv) -> None:
    """Trace one reset and one step (`jax.eval_shape`: nothing runs or compiles) and check what they return."""
    import jax
    import jax.numpy as jnp

    name, key = env.name, jax.random.PRNGKey(0)
    try:
        reset = jax.eval_shape(env.env.reset, key)
    except Exception as error:  # noqa: BLE001
        fail("env", name, f"reset(key) failed when traced ({type(error).__name__}: {_first_line(error)})")
    require(isinstance(reset, tuple) and len(reset) == 2, "env", name,
            f"reset(key) must return (obs, state); it returned {_shown(reset)}")
    _check_obs(name, reset[0], env.observation_shape, "reset")
    space = env.action_space
    action = (jax.ShapeDtypeStruct((), jnp.int32) if isinstance(space, Discrete)
              else jax.ShapeDtypeStruct(space.shape, jnp.float32))
    try:
        out = jax.eval_shape(env.env.step, key, reset[1], action)
    except Exception as error:  # noqa: BLE001
        fail("env", name, f"step(key, state, action) failed when traced ({type(error).__name__}: {_first_line(error)})")
    require(isinstance(out, StepOut), "env", name, "step(key, state, action) must return sparqrl.envs.StepOut(obs, "
            f"state, reward, terminated, truncated, final_obs, info); it returned {_shown(out)}")
    _check_obs(name, out.obs, env.observation_shape, "step")
    _check_obs(name, out.final_obs, env.observation_shape, "step's final_obs")
    for field in ("reward", "terminated", "truncated"):
        require(getattr(out, field).shape == (), "env", name,
                f"step's {field} must be a scalar per environment; its shape is {getattr(out, field).shape}")
    require(isinstance(out.info, dict), "env", name, f"step's info must be a dict; it is {type(out.info).__name__}")


def _check_obs(name: str, obs: Any, shape: tuple[int, ...], where: str) -> None:
    require(hasattr(obs, "shape") and hasattr(obs, "dtype"), "env", name,
            f"{where} must return the observation as one array; it returned {_shown(obs)}")
    require(tuple(obs.shape) == shape, "env", name,
            f"{where} returned observations of shape {tuple(obs.shape)}, not observation_shape {shape}")
    check_obs_dtype(name, obs.dtype)


def check_obs_dtype(name: str, dtype: Any) -> None:
    """Float observations are used as they are (as float32), integer and boolean ones are cast to float32;
    anything else (object, strings) is an error naming the dtype."""
    require(np.dtype(dtype).kind in "biuf", "env", name,
            f"returns observations of dtype {np.dtype(dtype)}; they must be numbers (float; int and bool are "
            "cast to float32)")


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a {type(value).__name__} of {len(value)} values"
    return type(value).__name__


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]
