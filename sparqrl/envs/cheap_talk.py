"""Adversarial cheap talk (ACT; Lu, Willi, Letcher, Foerster, ICML 2023, arXiv 2211.11030; reference
`meta_mfos_act.md` §3): an adversary that can only *append* a deterministic message to the victim's
observation.

    victim observation = concat(env_obs, scale * tanh(adversary(adversary_input)))      [obs_dim + n_dims]

`adversary_input` is the env observation, plus what the env adds for the adversary alone (the goal of
`goal_cartpole`, through the `adversary_observation` hook below), plus, only with `include_action`, the
victim's previous action (one-hot for discrete actions, the raw vector for continuous ones; zeros at the
start of the victim's lifetime). The adversary never sees rewards, the victim's parameters or, by default,
its actions.

Adversaries (the reference's evosax networks):
  mlp   2 x 64 ReLU, then a linear layer to n_dims (the reference's `--static`)
  lstm  an LSTM of 32 units and a linear head (the reference's default): its carry lives in the wrapper's
        state and runs for the victim's whole lifetime; an episode's auto-reset does not reset it.

The adversary's parameters (the genome an ES evolves) are a field of the wrapper, so a fitness function
builds `CheapTalk(env, params)` inside its jitted, population-vmapped body; they are only ever used as
JAX values. All-zero parameters (`zero_adversary`) give tanh(0) = 0: the message of the reference's
OpenES, whose mean starts at 0. An observation normaliser (PPO's `normalize_obs`) sits outside this
wrapper and therefore normalises the message too, as the reference's `VecNormalizer` does.

Order of wrappers: `EpisodeStats(CheapTalk(env, params))`; CheapTalk wraps the plain env, whose
`adversary_observation` hook it calls with that env's own state.

Environments of the paper: `act_cartpole()` (CartPole cut at 200 steps, the time-out a true end) and
`goal_cartpole()` (the GEN variant: a random goal position the adversary sees, `info["goal_reward"]`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from sparqrl.config import fail, is_int, is_number, one_of, require
from sparqrl.envs.core import Env, StepOut, action_dim, is_discrete
from sparqrl.envs.gymnax_env import gymnax, wrap_gymnax
from sparqrl.envs.wrappers import Wrapper
from sparqrl.nets.modules import sequential_under_vmap

KINDS = ("mlp", "lstm")
MLP_HIDDEN = (64, 64)
"""Hidden widths of the static adversary (evosax 0.0.4 `NetworkMapper["MLP"]` as ACT configures it)."""
LSTM_UNITS = 32
"""Units of the recurrent adversary."""
TRAIN_SCALE = 2.0 * math.pi
"""`CT_SCALE` of the reference's train-time runs (`main_train_time.py`)."""
TEST_SCALE = math.pi
"""`CT_SCALE` of the reference's train/test-time control runs (`main_test_time.py`)."""
CARTPOLE_X_LIMIT = 2.4
"""CartPole's cart-position bound; `goal_cartpole` draws its goals in [-2.4, 2.4]."""


# --------------------------------------------------------------------------------------------------
# Adversary networks
# --------------------------------------------------------------------------------------------------


class MLPAdversary(nn.Module):
    """[..., input_dim] -> pre-tanh message [..., n_dims]: ReLU hidden layers, then a linear layer."""

    n_dims: int
    hidden: tuple[int, ...] = MLP_HIDDEN

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.n_dims)(x)


class LSTMAdversary(nn.Module):
    """(carry, [..., input_dim]) -> (carry, pre-tanh message [..., n_dims]); carry = (c, h), [..., units] each."""

    n_dims: int
    units: int = LSTM_UNITS

    @nn.compact
    def __call__(self, carry: tuple[jax.Array, jax.Array], x: jax.Array) -> tuple[Any, jax.Array]:
        carry, h = nn.OptimizedLSTMCell(self.units)(carry, x)
        return carry, nn.Dense(self.n_dims)(h)


class Adversary(NamedTuple):
    """An adversary's pure functions; `params` is the flax variable dict `init` returns (the genome).

    init(key) -> params
    initial_carry() -> carry                 zeros: LSTM (c, h), [units] each; None for the static MLP
    apply(params, carry, x [input_dim]) -> (carry, raw [n_dims])
                                             raw is pre-tanh: the message is scale * tanh(raw)
    """

    kind: str
    n_dims: int
    input_dim: int
    init: Callable[[jax.Array], Any]
    initial_carry: Callable[[], Any]
    apply: Callable[[Any, Any, jax.Array], tuple[Any, jax.Array]]


def _check_adversary(input_dim: int, n_dims: int, kind: str) -> None:
    for name, value, low in (("n_dims", n_dims, 1), ("adversary input size", input_dim, 1)):
        require(is_int(value) and value >= low,
                name, value, f"must be an integer >= {low}")
    one_of("kind", kind, KINDS)


def make_adversary(input_dim: int, n_dims: int = 2, kind: str = "lstm") -> Adversary:
    """The `kind` adversary ('mlp' or 'lstm') reading [input_dim] vectors and emitting [n_dims] messages."""
    _check_adversary(input_dim, n_dims, kind)
    x = jnp.zeros((input_dim,), jnp.float32)
    if kind == "mlp":
        module = MLPAdversary(n_dims)
        return Adversary(
            kind, n_dims, input_dim,
            init=lambda key: module.init(key, x),
            initial_carry=lambda: None,
            apply=lambda params, carry, inputs: (carry, module.apply(params, inputs)),
        )
    module = LSTMAdversary(n_dims)

    def initial_carry() -> tuple[jax.Array, jax.Array]:
        return jnp.zeros((LSTM_UNITS,), jnp.float32), jnp.zeros((LSTM_UNITS,), jnp.float32)

    return Adversary(
        kind, n_dims, input_dim,
        # The LSTM's recurrent kernel is orthogonal (a QR): one at a time when a population is vmapped
        # (see `sequential_under_vmap`).
        init=sequential_under_vmap(lambda key: module.init(key, initial_carry(), x)),
        initial_carry=initial_carry,
        apply=lambda params, carry, inputs: module.apply(params, carry, inputs),
    )


def adversary_init(key: jax.Array, obs_dim: int, n_dims: int = 2, kind: str = "lstm", action_dim: int = 0) -> Any:
    """Random adversary parameters (flax's default initialisers) for an adversary that reads `obs_dim`
    observation entries (`adversary_obs_dim(env)`) and, when it sees the victim's actions, `action_dim`
    more (`core.action_dim(env)`; 0 when it does not)."""
    return make_adversary(obs_dim + action_dim, n_dims, kind).init(key)


def zero_adversary(obs_dim: int, n_dims: int = 2, kind: str = "lstm", action_dim: int = 0) -> Any:
    """All-zero adversary parameters (the OpenES mean at the start): every message is tanh(0) * scale = 0."""
    adversary = make_adversary(obs_dim + action_dim, n_dims, kind)
    shapes = jax.eval_shape(adversary.init, jax.random.PRNGKey(0))
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


# --------------------------------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------------------------------


def adversary_hook(env: Env) -> Callable[[Any, jax.Array], jax.Array] | None:
    """The env's `adversary_observation(state, obs) -> [k]` hook (what the adversary reads instead of the
    bare observation, e.g. `goal_cartpole`'s observation and goal), or None. Looked up on the env's class,
    so a wrapper that forwards attributes (`EpisodeStats`) does not pass on a hook it cannot feed its own
    state to (`CheapTalk` refuses such an env)."""
    return env.adversary_observation if getattr(type(env), "adversary_observation", None) is not None else None


def adversary_obs_dim(env: Env) -> int:
    """Entries of the adversary's observation: the env observation's, or those of the env's
    `adversary_observation` hook (`goal_cartpole`: observation + goal = 5)."""
    hook = adversary_hook(env)
    if hook is None:
        return int(math.prod(env.observation_shape))

    def observe(key: jax.Array) -> jax.Array:
        obs, state = env.reset(key)
        return hook(state, obs)

    shape = jax.eval_shape(observe, jax.random.PRNGKey(0)).shape
    require(len(shape) == 1, "env", env.name, f"adversary_observation must return a vector; got shape {shape}")
    return int(shape[0])


class CheapTalkState(NamedTuple):
    """State of one wrapped env."""

    inner: Any  # the wrapped env's state
    carry: Any  # the adversary's recurrent state over the victim's lifetime: LSTM (c, h) [units]; mlp: None
    last_action: jax.Array  # [action_dim] float32: the victim's last action (one-hot when discrete); zeros at the
    #                         lifetime's start, carried over episode ends (as the reference's wrapper does)


@dataclasses.dataclass(frozen=True, eq=False)
class CheapTalk(Wrapper):
    """An `Env` whose observations carry the adversary's message: [obs_dim + n_dims] (module docstring).

    `env` must have flat observations [obs_dim]. `params` is the adversary's genome (`adversary_init`,
    `zero_adversary`): concrete arrays or tracers. Bad arguments are one-line `ConfigError`s, raised when
    the wrapper is built (before anything is compiled).
    """

    env: Env
    params: Any
    n_dims: int = 2
    kind: str = "lstm"
    scale: float = TRAIN_SCALE
    include_action: bool = False

    def __post_init__(self) -> None:
        shape = tuple(self.env.observation_shape)
        require(len(shape) == 1, "env", getattr(self.env, "name", self.env),
                f"cheap talk needs flat observations [obs_dim]; this env's have shape {shape}")
        scale_ok = is_number(self.scale)
        require(scale_ok and math.isfinite(self.scale) and self.scale > 0, "scale", self.scale,
                "must be a finite number > 0 (ACT: 2*pi at train time, pi at test time)")
        require(isinstance(self.include_action, bool), "include_action", self.include_action, "must be True or False")
        if adversary_hook(self.env) is None and hasattr(self.env, "adversary_observation"):
            fail("env", self.env.name, "has an adversary_observation hook behind a wrapper: wrap the plain env "
                                       "in CheapTalk and put EpisodeStats outside it")
        self._check_params(self.adversary)

    def _check_params(self, adversary: Adversary) -> None:
        """The genome has the tree and leaf shapes this kind, n_dims and input size need."""
        expected = jax.eval_shape(adversary.init, jax.random.PRNGKey(0))
        shapes = [tuple(jnp.shape(x)) for x in jax.tree.leaves(self.params)]
        same_tree = jax.tree.structure(self.params) == jax.tree.structure(expected)
        same_shapes = shapes == [tuple(s.shape) for s in jax.tree.leaves(expected)]
        summary = ", ".join(map(str, shapes[:4])) + (", ..." if len(shapes) > 4 else "")
        require(same_tree and same_shapes, "params", f"<{len(shapes)} arrays: {summary}>",
                f"must be the parameters of a kind={self.kind!r} adversary with input size {adversary.input_dim} "
                f"and n_dims {self.n_dims} (adversary_init/zero_adversary with the same arguments)")

    @functools.cached_property
    def adversary(self) -> Adversary:
        """The adversary these fields describe (built once per wrapper)."""
        extra = action_dim(self.env) if self.include_action else 0
        return make_adversary(adversary_obs_dim(self.env) + extra, self.n_dims, self.kind)

    @property
    def name(self) -> str:
        return f"{self.env.name}+cheap-talk"

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (int(self.env.observation_shape[0]) + self.n_dims,)

    def encode_action(self, action: jax.Array) -> jax.Array:
        """One victim action -> [action_dim] float32: one-hot (discrete) or the raw vector (continuous)."""
        if is_discrete(self.env):
            return jax.nn.one_hot(action, self.env.action_space.n, dtype=jnp.float32)
        return jnp.asarray(action, jnp.float32).reshape((action_dim(self.env),))

    def adversary_input(self, inner: Any, obs: jax.Array, last_action: jax.Array) -> jax.Array:
        """What the adversary reads [input_dim]: the env's adversary observation (default: `obs`), then the
        encoded previous action only when `include_action`."""
        hook = adversary_hook(self.env)
        x = hook(inner, obs) if hook is not None else obs
        x = jnp.asarray(x, jnp.float32)
        return jnp.concatenate([x, last_action]) if self.include_action else x

    def message(self, carry: Any, adversary_input: jax.Array) -> tuple[Any, jax.Array]:
        """(carry, [..., input_dim]) -> (next carry, message [..., n_dims] = scale * tanh(adversary(input)));
        leading axes are batch axes (of the carry's leaves too)."""
        carry, raw = self.adversary.apply(self.params, carry, adversary_input)
        return carry, self.scale * jnp.tanh(raw)

    def reset(self, key: jax.Array) -> tuple[jax.Array, CheapTalkState]:
        """A new lifetime: the env's reset, a fresh adversary carry, no previous action (zeros)."""
        obs, inner = self.env.reset(key)
        obs = jnp.asarray(obs, jnp.float32)
        last_action = jnp.zeros((action_dim(self.env),), jnp.float32)
        carry, message = self.message(self.adversary.initial_carry(), self.adversary_input(inner, obs, last_action))
        return jnp.concatenate([obs, message]), CheapTalkState(inner, carry, last_action)

    def step(self, key: jax.Array, state: CheapTalkState, action: jax.Array) -> StepOut:
        """One env step (same key and action as the plain env) and one adversary step. The adversary's
        carry advances on the observation the victim sees next (after an auto-reset: the new episode's);
        `final_obs` carries the message the same adversary step gives for the pre-reset observation (with
        the pre-step env state, so a per-episode goal is the ended episode's), i.e. what the victim would
        have seen: equal to `obs` whenever the episode goes on."""
        out = self.env.step(key, state.inner, action)
        last_action = self.encode_action(action)
        obs = jnp.asarray(out.obs, jnp.float32)
        final_obs = jnp.asarray(out.final_obs, jnp.float32)
        # Both observations go through one adversary call as a batch of 2 from the same carry.
        inputs = jnp.stack([self.adversary_input(out.state, obs, last_action),
                            self.adversary_input(state.inner, final_obs, last_action)])
        carries = jax.tree.map(lambda c: jnp.broadcast_to(c, (2, *c.shape)), state.carry)
        carries, messages = self.message(carries, inputs)
        return out._replace(
            obs=jnp.concatenate([obs, messages[0]]),
            state=CheapTalkState(out.state, jax.tree.map(lambda c: c[0], carries), last_action),
            final_obs=jnp.concatenate([final_obs, messages[1]]),
        )


# --------------------------------------------------------------------------------------------------
# ACT's CartPole variants
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TimeLimitIsEnd(Wrapper):
    """`env` with its time-limit truncation counted as a true end (terminated, never truncated): the
    reference's hand-written CartPole sets `done` on the time-out and PPO does not bootstrap it."""

    env: Env
    name: str

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        return self.env.reset(key)

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepOut:
        out = self.env.step(key, state, action)
        return out._replace(terminated=jnp.logical_or(out.terminated, out.truncated),
                            truncated=jnp.zeros_like(out.truncated))


def act_cartpole(max_steps: int = 200) -> TimeLimitIsEnd:
    """ACT's CartPole: gymnax CartPole-v1 dynamics and reward (1 per step), the episode cut after
    `max_steps` (200) steps, the time-out a termination. Observations [4], actions Discrete(2).

    (The reference's own CartPole tests `t >= 200` before counting the step, so its episodes can last
    201 steps; here the 200th step ends it, as in CartPole-v0.)"""
    require(is_int(max_steps) and max_steps >= 1,
            "max_steps", max_steps, "must be an integer >= 1")
    env, params = gymnax.make("CartPole-v1")
    params = params.replace(max_steps_in_episode=int(max_steps))
    return TimeLimitIsEnd(wrap_gymnax("CartPole-v1", env, params), name=f"ACT-CartPole-{max_steps}")


class GoalState(NamedTuple):
    """State of `GoalCartPole`: CartPole's, and the goal drawn at the episode's reset."""

    inner: Any
    goal: jax.Array  # [] float32: the cart position x the adversary wants the cart at


@dataclasses.dataclass(frozen=True, eq=False)
class GoalCartPole(Wrapper):
    """ACT's GEN task (reference §3.3, `cartpole_goal.py`): `act_cartpole`'s observations, rewards and
    ends for the victim; at every reset a goal x ~ U[-2.4, 2.4] is drawn and kept for the episode. The
    adversary sees [obs, goal] (`adversary_observation`), and `info["goal_reward"]` = exp(-(x - goal)^2)
    of the cart position x each step reaches (before any auto-reset), for a fitness to average."""

    env: Env
    goal_limit: float = CARTPOLE_X_LIMIT
    name: str = "ACT-GoalCartPole-200"

    def _goal(self, key: jax.Array) -> jax.Array:
        return jax.random.uniform(key, (), jnp.float32, -self.goal_limit, self.goal_limit)

    def reset(self, key: jax.Array) -> tuple[jax.Array, GoalState]:
        env_key, goal_key = jax.random.split(key)
        obs, inner = self.env.reset(env_key)
        return obs, GoalState(inner, self._goal(goal_key))

    def step(self, key: jax.Array, state: GoalState, action: jax.Array) -> StepOut:
        env_key, goal_key = jax.random.split(key)
        out = self.env.step(env_key, state.inner, action)
        cart_x = out.final_obs[0]
        goal_reward = jnp.exp(-jnp.square(cart_x - state.goal))
        done = jnp.logical_or(out.terminated, out.truncated)
        goal = jnp.where(done, self._goal(goal_key), state.goal)
        return out._replace(state=GoalState(out.state, goal), info={**out.info, "goal_reward": goal_reward})

    def adversary_observation(self, state: GoalState, obs: jax.Array) -> jax.Array:
        """[obs_dim + 1]: the observation and the goal of the episode `state` is in."""
        return jnp.concatenate([jnp.asarray(obs, jnp.float32), state.goal[None]])


def goal_cartpole(max_steps: int = 200) -> GoalCartPole:
    """ACT's goal-reaching CartPole (GEN) over `act_cartpole(max_steps)`; wrap it as
    `CheapTalk(goal_cartpole(), params)` with params for `adversary_obs_dim` = 5 inputs."""
    return GoalCartPole(act_cartpole(max_steps), name=f"ACT-GoalCartPole-{max_steps}")
