"""The contract between an algorithm and the runners, and the deterministic evaluation loop.

An algorithm is a bundle of pure functions over its own typed state for ONE seed (`Algorithm`).
The runners vmap it over seeds, scan `update` in chunks, and shard the seed axis over devices.

Hyperparameters as inputs. Each algorithm's Config names in `TRACED` the numeric fields its compiled
program takes as traced inputs (`hparams`: a dict of float32 scalars, per member [M] once vmapped),
so that settings x seeds (a sweep, an evolved population) run as one program. The algorithm is built
again inside the trace from the config with those fields replaced by tracers (`with_hparams`):
`make_algorithm` reads them like any other field, and only skips its host-side checks for such a
config (`has_tracers`), the concrete values having been checked before tracing (`check_hparams`).
Every other field fixes shapes or loop counts and stays static.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sparqrl.config import fail
from sparqrl.envs import Env
from sparqrl.nets.memory import Memory, reset_carry
from sparqrl.nets.modules import flatten_obs

# Keys every `update` must put in its metrics; the runner turns them into mean episode returns
# over the episodes that really finished in a chunk (a chunk with none reports NaN, never 0).
EPISODE_RETURN_SUM = "episode_return_sum"
EPISODE_COUNT = "episode_count"


class Algorithm(NamedTuple):
    """What `make_algorithm(config, env)` returns.

    init(key) -> state                      the full training state of one seed
    update(state) -> (state, metrics)       one iteration: act for `env_steps_per_update` env steps, learn;
                                            metrics is a flat dict of scalars including the two keys above
    policy(state) -> policy_params          everything the deterministic policy needs (params, normaliser)
    act(policy_params, obs, key) -> action  the deterministic (greedy / mean) action for one observation
    sample(policy_params, obs, key) -> action
                                            the exploring action for one observation, as training acts once
                                            past any warm-up (PPO's distribution, DQN's final epsilon, TD3's
                                            noise, SAC's squashed Gaussian); `sparqrl.load(...).act(...,
                                            deterministic=False)`
    """

    init: Callable[[jax.Array], Any]
    update: Callable[[Any], tuple[Any, dict[str, jax.Array]]]
    policy: Callable[[Any], Any]
    act: Callable[[Any, jax.Array, jax.Array], jax.Array]
    env_steps_per_update: int
    num_updates: int
    summary: dict[str, Any] = {}
    """Static facts for summary.json (e.g. a sparse run's sparsities and size/FLOPs ratios)."""
    sample: Callable[[Any, jax.Array, jax.Array], jax.Array] | None = None


HParams = dict[str, jax.Array]
"""Traced hyperparameters: Config field name -> float32 value ([] for one member, [M] for M)."""


def traced_fields(config: Any) -> tuple[str, ...]:
    """The fields of `config` its algorithm takes as traced inputs (the Config's `TRACED`)."""
    return tuple(getattr(type(config), "TRACED", ()))


def hparams_of(config: Any) -> dict[str, float]:
    """The traced hyperparameters' values in `config`, as host floats."""
    return {name: float(getattr(config, name)) for name in traced_fields(config)}


def with_hparams(config: Any, hparams: Mapping[str, Any]) -> Any:
    """`config` with traced fields replaced by `hparams` (tracers inside a program, floats outside)."""
    return dataclasses.replace(config, **hparams)


def has_tracers(config: Any) -> bool:
    """True for a config built by `with_hparams` inside a trace: its checks ran on the concrete values."""
    return any(isinstance(getattr(config, name), jax.core.Tracer) for name in traced_fields(config))


def clipped_adam(learning_rate: float | optax.Schedule, max_grad_norm: float | jax.Array | None, eps: float = 1e-8
                 ) -> optax.GradientTransformation:
    """Adam after global-norm clipping (none for max_grad_norm None), on all parameters raveled into one
    vector (`optax.flatten`): the same arithmetic, but the norm and the Adam step are a few kernels for the
    whole network instead of a few per weight array, which for small networks on a CPU is most of a
    gradient step's optimizer time and a part of its compile time (BENCHMARKS.md: "one raveled optimizer step")."""
    adam = optax.adam(learning_rate, eps=eps)
    if max_grad_norm is not None:
        adam = optax.chain(optax.clip_by_global_norm(max_grad_norm), adam)
    return optax.flatten(adam)


def actor_critic_optimizer(config: Any) -> optax.GradientTransformation:
    """The optimizer after global-norm clipping to max_grad_norm, on all parameters raveled into one vector (as
    `clipped_adam`), its rate annealed linearly to 0 over the run's updates if asked.

    rmsprop is TF1's `RMSPropOptimizer`, which the A2C and IMPALA papers and Baselines' a2c use: ms ← α·ms +
    (1 − α)·g², starting at ms = 1, and the step lr·g / sqrt(ms + ε), ε inside the square root (optax's
    `eps_in_sqrt=True`, `initial_scale=1`; PyTorch's and SB3's RMSprop start at 0 and add ε outside,
    lr·g / (sqrt(ms) + ε)).
    adam: Adam with ε 1e-5, as PPO's."""
    learning_rate = optax.linear_schedule(config.lr, 0.0, config.num_updates) if config.anneal_lr else config.lr
    if config.optimizer == "adam":
        return clipped_adam(learning_rate, config.max_grad_norm, eps=1e-5)
    rmsprop = optax.rmsprop(learning_rate, decay=config.rmsprop_alpha, eps=config.rmsprop_eps, initial_scale=1.0,
                            eps_in_sqrt=True)
    return optax.flatten(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), rmsprop))


def make_train_fn(algo: Algorithm) -> Callable[[jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """The whole run of one built algorithm (its hyperparameters constants) as one pure function
    `train(key) -> (state, metrics [num_updates])`."""

    def train(key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        state = algo.init(key)
        return jax.lax.scan(lambda s, _: algo.update(s), state, None, length=algo.num_updates)

    return train


def make_hparams_train_fn(make_algorithm: Callable[[Any, Any], Algorithm], config: Any, env: Any
                          ) -> Callable[..., tuple[Any, dict[str, jax.Array]]]:
    """The whole run as one pure function `train(key, hparams=None) -> (state, metrics [num_updates])`.

    `config` must be checked and resolved (`Config.validate(env)`); `hparams` (float32 scalars, by name
    of `traced_fields(config)`, any subset) replace those fields as traced inputs, so `jax.vmap(train)`
    over keys and hparams trains many settings in one program. None: the config's values, as inputs.
    """
    names = traced_fields(config)

    def train(key: jax.Array, hparams: Mapping[str, jax.Array] | None = None) -> tuple[Any, dict[str, jax.Array]]:
        given = {} if hparams is None else dict(hparams)
        values = {n: given.pop(n, jnp.float32(getattr(config, n))) for n in names}
        if given:
            raise KeyError(f"not traced hyperparameters of {type(config).__qualname__}: {sorted(given)}")
        return make_train_fn(make_algorithm(with_hparams(config, values), env))(key)

    return train


STEP_METRICS = ("goal_reward",)
"""Per-step env infos averaged into an update's metrics where an env reports them (ACT's goal CartPole:
the reward of reaching its goal, which the victim does not train on but the adversary's fitness is)."""


def episode_metrics(info: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sum and count of the returns of episodes that finished in a batch of `EpisodeStats` infos, and the
    mean of each `STEP_METRICS` info the env reports."""
    done = info["episode_done"]
    return {
        EPISODE_RETURN_SUM: jnp.sum(jnp.where(done, info["episode_return"], 0.0)),
        EPISODE_COUNT: jnp.sum(done).astype(jnp.float32),
        **{name: jnp.mean(info[name]) for name in STEP_METRICS if name in info},
    }


def evaluate(env: Env, act: Callable, policy_params: Any, key: jax.Array, num_episodes: int) -> jax.Array:
    """Returns [num_episodes] of the deterministic policy, each episode run to its end.

    Episodes run in parallel until every one has ended (at most `env.max_episode_steps` steps: an evaluation
    costs what its longest episode needs, issue 33); rewards after an episode's first end are masked out, so an
    auto-reset never leaks into the score. Step i uses the i-th of `env.max_episode_steps` keys split in
    advance, so the returns equal those of running every step.
    """
    reset_key, step_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))
    recurrent = isinstance(act, RecurrentAct)  # then its state is carried along each episode

    def step(carry, key):
        obs, state, total, alive, memory = carry
        act_keys = jax.random.split(key, num_episodes + 1)
        if recurrent:
            action, memory = act.step(policy_params, obs, act_keys[1:], memory)
        else:
            action = jax.vmap(act, in_axes=(None, 0, 0))(policy_params, obs, act_keys[1:])
        out = jax.vmap(env.step)(jax.random.split(act_keys[0], num_episodes), state, action)
        total = total + jnp.where(alive, out.reward, 0.0)
        alive = alive & ~(out.terminated | out.truncated)
        return (out.obs, out.state, total, alive, memory), None

    init = (obs, state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool),
            act.init(num_episodes) if recurrent else None)
    keys = jax.random.split(step_key, env.max_episode_steps)

    def running(loop: tuple) -> jax.Array:
        i, (_, _, _, alive, _) = loop
        return (i < env.max_episode_steps) & jnp.any(alive)

    def next_step(loop: tuple) -> tuple:
        i, carry = loop
        return i + 1, step(carry, keys[i])[0]

    _, (_, _, total, _, _) = jax.lax.while_loop(running, next_step, (jnp.int32(0), init))
    return total


# ---- the actor-learner contract (host environments, `sparqrl.runners.sebulba`) -----------------


class Step(NamedTuple):
    """Env steps of N host environments as an actor sends them: leaves [T, N, ...] in a fragment (T steps
    of each env, in order; the runner adds a seed axis [S] in front), [N, ...] for one step."""

    obs: Any  # [N, *obs_shape], raw (as the env returned it)
    action: Any  # [N, ...] in the algorithm's units (e.g. [-1, 1] for continuous actions)
    reward: Any  # float32 [N]
    next_obs: Any  # [N, *obs_shape], the env's final_obs: pre-reset, so truncation can bootstrap
    terminated: Any  # bool [N]
    truncated: Any  # bool [N]
    extra: Any  # what `Acting.explore` returned beside the action (TD3: the noise-free action; PPO and
    #             IMPALA: the behaviour policy's log-probability of the action)
    priority: Any  # float32 [N]: the actor's initial replay priority (1 where the algorithm has none)
    discounted_return: Any = None  # float32 [N]: sum of gamma^k r of the running episode up to this reward,
    #             when `Acting.return_gamma` is set (reward scaling); else None
    value: Any = None  # float32 [N]: V(obs) and V(next_obs) under the learner's CURRENT critic where the runner
    next_value: Any = None  # computed them while acting (`on_device` with `Acting.value`: lag 0); None where
    #             actors act with copies that may be stale (the actor-learner runner): the learner computes them
    memory: Any = None  # [N, ...]: the recurrent state the actor held before acting on obs (`Acting.memory`), so the
    #             learner re-runs a fragment from its first step's; None for a feed-forward policy


class Acting(NamedTuple):
    """How an actor acts for one seed. The policy network is split from the rest so that its forward
    pass can run in any precision (`sparqrl.quant`): `network` maps obs [B, *obs] to raw outputs
    [B, out] and is a plain chain of Dense layers with `activation` between them; everything after it
    (squashing, sampling, noise, epsilon-greedy, priorities) runs in JAX in fp32 on its output.

    network                                   flax module: obs [B, *obs] -> raw [B, out]
    network_params(policy_params) -> vars     the flax variables of `network` inside the policy params
    explore(raw [N, out], key, env_steps, slots [N], total_slots, aux) -> (action [N, ...], extra [N, ...])
                                              env_steps: int32 [], env steps of all actors so far (warm-up);
                                              slots: each env's index among all actors' envs (Ape-X's
                                              per-slot epsilon); total_slots: a static int; aux: below
    greedy(raw [..., out]) -> action          the deterministic action (evaluation)
    to_env(action) -> env action              e.g. [-1, 1] -> [low, high]
    priority(raw_next [N, out], step [N]) -> [N] | None
                                              the actor-side initial priority (Ape-X), raw_next the network
                                              on step.next_obs; None: every priority is 1
    aux(policy_params) -> tree | None         small fp32 arrays beside the network that acting needs (PPO:
                                              observation statistics and log-std); published with every
                                              version in fp32 whatever the network's precision. None: none
    observe(aux, obs [B, *obs]) -> [B, *obs]  the network's input from raw observations (PPO: normalised);
                                              None: the raw observation
    return_gamma                              when set, actors send each env's discounted return so far
                                              (`Step.discounted_return`, for reward scaling)
    features                                  `nets.Features` where `network` starts with convolutions (a
                                              CNN torso): actors run them in fp32 and the Dense chain after
                                              them in their precision; None: the network is a Dense chain
    evaluate(raw [N, out], key) -> action [N] where a deterministic policy can stall (Atari evaluation):
                                              the evaluated action (DQN: epsilon-greedy at epsilon_finish);
                                              None: the actors' exploring action (`explore_one`)
    noise(key, shape) -> tree [*shape, ...]   all the randomness `explore_with` needs for envs laid out as
                                              `shape` ([N] one step, [T, N] a fragment); with `explore_with`,
                                              `explore` is `keyed(noise, explore_with)`, and `on_device` draws
                                              a whole fragment's at once (one random-number program per update,
                                              not one per step). None: `explore` takes its key
    explore_with(raw, noise [N, ...], env_steps, slots, total_slots, aux) -> (action, extra)
                                              `explore` from noise drawn ahead
    value(policy_params, x [N, *obs]) -> [N]  V of the network's input x (`observe`d) under the policy params,
                                              for a learner that bootstraps from a critic (PPO): `on_device`,
                                              whose acting policy is the learner's current one, hands the
                                              values it computes while acting to the learner (`Step.value`)
    memory                                    `nets.memory.Memory` of a recurrent policy: `network` is then
                                              (vars, x [N, *obs], carry [N, ...]) -> (raw, value, carry), the state
                                              reset at episode starts and sent with each step (`Step.memory`);
                                              None: feed-forward
    """

    network: Any
    network_params: Callable[[Any], Any]
    activation: str
    explore: Callable[..., tuple[Any, Any]]
    greedy: Callable[[jax.Array], jax.Array]
    to_env: Callable[[jax.Array], jax.Array]
    priority: Callable[[jax.Array, Step], jax.Array] | None = None
    aux: Callable[[Any], Any] | None = None
    observe: Callable[[Any, jax.Array], jax.Array] | None = None
    return_gamma: float | None = None
    features: Any = None
    evaluate: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    noise: Callable[[jax.Array, tuple[int, ...]], Any] | None = None
    explore_with: Callable[..., tuple[Any, Any]] | None = None
    value: Callable[[Any, jax.Array], jax.Array] | None = None
    memory: Memory | None = None


@dataclasses.dataclass(frozen=True)
class RecurrentAct:
    """`Algorithm.act`/`sample` of a recurrent policy, which acts on episodes with its state, not on single
    observations: `init(n)` the state of n episodes; `step(policy_params, obs [n, *obs], keys [n], carry) ->
    (action [n], carry)` (`evaluate` carries it). Called as a feed-forward act it refuses in one line."""

    kind: str
    init: Callable[[int], Any]
    step: Callable[[Any, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]

    def __call__(self, *args: Any) -> None:
        fail("memory", self.kind, "is a recurrent policy: it acts on whole episodes with its state "
             "(sparqrl eval, agent.evaluate; sparqrl export makes the state an input and output), not on single "
             "observations (agent.act, videos)")


def keyed(noise: Callable[[jax.Array, tuple[int, ...]], Any], explore_with: Callable[..., tuple[Any, Any]]
          ) -> Callable[..., tuple[Any, Any]]:
    """`Acting.explore` of an acting that explores from noise drawn ahead (`Acting.noise`): one step's noise
    of N envs drawn from the key, so the actors' per-step path and `on_device`'s per-fragment one act alike."""

    def explore(raw: jax.Array, key: jax.Array, env_steps: jax.Array, slots: jax.Array, total_slots: int,
                aux: Any = None) -> tuple[Any, Any]:
        return explore_with(raw, noise(key, raw.shape[:1]), env_steps, slots, total_slots, aux)

    return explore


def bootstrap_values(values: jax.Array, last_value: jax.Array, truncated: jax.Array,
                     truncated_value: jax.Array) -> jax.Array:
    """V(s'_t) for `gae`, s'_t the observation step t reached before any auto-reset:

        next_values[t] = truncated_value[t]   where a time limit truncated the episode at t
                         values[t + 1]         otherwise (last_value for the final step)

    (after a termination the value is never used: `gae` does not bootstrap there).

    Args:
      values, truncated, truncated_value: [T, B]; last_value: [B], the value after the rollout.
    Returns:
      [T, B].
    """
    following = jnp.concatenate([values[1:], last_value[None]], axis=0)
    return jnp.where(truncated, truncated_value, following)


class ActorLearner(NamedTuple):
    """What `make_actor_learner(config, spec)` returns: the learner's pure functions for ONE seed (the
    runner vmaps them over seeds) and the actors' `Acting`. Both runners drive the same learner: the
    actor-learner runner on the fragments its actors send, the on-device runner (`on_device`) on
    fragments it rolls out in JAX environments.

    init(key) -> learner                      networks, optimizer states, replay buffer, counters
    learn(learner, steps [T, N]) -> (learner, metrics)
                                              learn from one fragment: T env steps of N envs (`Step`, its
                                              fields in time order); metrics: flat dict of float scalars,
                                              means over the fragment. Replay-based learners store and
                                              learn step by step (`per_step`); on-policy ones learn from
                                              the fragment as a whole (PPO's epochs, IMPALA's V-trace)
    policy(learner) -> policy_params          what actors need (published, maybe quantized, per version)
    num_envs                                  N: the host environments one actor steps per seed
    steps_per_env                             the run's budget: env steps per environment of one seed
                                              (all actors' fragments together), i.e. total / N
    fragment_steps                            T the learner needs (PPO: its num_steps); 0: any (the run's)
    for_fragments(T) -> ActorLearner          the same learner with its stores sized for the run's fragments of
                                              T env steps (DQN on Atari: its frame ring); None: T changes nothing
    on_policy                                 True: a fragment acted with a policy more than the run's
                                              `max_lag` learner updates old is dropped and counted, never
                                              learned from (PPO); False: any age (replay)
    joins_fragments                           True: `learn` stores each fragment after the one before and reads
                                              consecutive rows as one env's consecutive steps (a replay's n-step
                                              windows); the actor-learner runner, whose next fragment may be
                                              another actor's envs, then marks each fragment's last step
                                              `truncated`, so no window joins two (`runners.sebulba`). False:
                                              nothing reads across a fragment's end
    """

    init: Callable[[jax.Array], Any]
    learn: Callable[[Any, Step], tuple[Any, dict[str, jax.Array]]]
    policy: Callable[[Any], Any]
    acting: Acting
    num_envs: int
    steps_per_env: int
    summary: dict[str, Any] = {}
    fragment_steps: int = 0
    for_fragments: Callable[[int], "ActorLearner"] | None = None
    on_policy: bool = False
    joins_fragments: bool = False


def per_step(learn_step: Callable[[Any, Step], tuple[Any, dict[str, jax.Array]]], unroll: bool = False
             ) -> Callable[[Any, Step], tuple[Any, dict[str, jax.Array]]]:
    """The fragment learner of a replay-based algorithm: `learn_step(learner, step [N])` (store one env step
    of N envs, take the gradient steps it makes due) scanned over the fragment's T steps in order; the
    metrics are means over the T steps. `unroll`: the T steps as straight-line code, no loop (a CNN's
    gradient runs ~10x slower inside a loop body on XLA's CPU back-end, jax-ml/jax#12868)."""

    def learn(learner: Any, steps: Step) -> tuple[Any, dict[str, jax.Array]]:
        learner, metrics = jax.lax.scan(learn_step, learner, steps, unroll=unroll)
        return learner, {name: jnp.mean(value, axis=0) for name, value in metrics.items()}

    return learn


def acting_aux(acting: Acting, policy_params: Any) -> Any:
    return None if acting.aux is None else acting.aux(policy_params)


def explore_one(acting: Acting, raw: jax.Array, key: jax.Array, aux: Any = None) -> jax.Array:
    """The exploring action [N, ...] (algorithm units) of one actor's env slot 0, long past any warm-up, on
    the network's output raw [N, out] (for DQN on the actor-learner: Ape-X's first slot's epsilon)."""
    n = raw.shape[0]
    return acting.explore(raw, key, jnp.int32(2 ** 30), jnp.zeros(n, jnp.int32), 1, aux)[0]


def observe(acting: Acting, aux: Any, obs: jax.Array) -> jax.Array:
    """The network's input from raw observations (`Acting.observe`), in fp32."""
    obs = jnp.asarray(obs, jnp.float32)
    return obs if acting.observe is None else acting.observe(aux, obs)


def forward(acting: Acting, policy_params: Any, obs: jax.Array, obs_ndim: int) -> jax.Array:
    """The policy network's raw output [..., out] on raw observations [..., *obs_shape], in fp32."""
    x = observe(acting, acting_aux(acting, policy_params), obs)
    return acting.network.apply(acting.network_params(policy_params), flatten_obs(x, obs_ndim))


class OnDeviceState(NamedTuple):
    """`on_device`'s state of one seed: the learner, the JAX environments it steps and their observations."""

    learner: Any
    env_state: Any  # [N]
    obs: jax.Array  # [N, *obs_shape], raw
    discounted_return: jax.Array  # float32 [N] (zeros unless `Acting.return_gamma`)
    env_steps: jax.Array  # int32 [], env steps of this seed so far
    key: jax.Array
    memory: Any = None  # [N, ...]: a recurrent policy's state before the next step (`Acting.memory`); else None


def network_step(acting: Acting, policy_params: Any, x: jax.Array, memory: Any, obs_ndim: int) -> tuple[jax.Array, Any]:
    """The policy network's raw output [N, out] on the observed input x [N, *obs], and a recurrent policy's state
    after it (`Acting.memory`; None for a feed-forward one)."""
    variables = acting.network_params(policy_params)
    if acting.memory is None:
        return acting.network.apply(variables, flatten_obs(x, obs_ndim)), None
    raw, _, memory = acting.network.apply(variables, x, memory)
    return raw, memory


def acting_values(acting: Acting, policy_params: Any, aux: Any, x: jax.Array, out: Any) -> tuple[jax.Array, jax.Array]:
    """V(obs) [N] of the observed input x, and V(final obs) [N] (used only where truncated) of the env step `out`,
    the latter computed only if some env was truncated: always computing it cost ~8 % of a 1-seed PPO CartPole run."""
    value = acting.value(policy_params, x)
    truncated_value = jax.lax.cond(
        jnp.any(out.truncated), lambda obs: acting.value(policy_params, observe(acting, aux, obs)),
        lambda obs: jnp.zeros_like(value), out.final_obs)
    return value, truncated_value


def on_device(al: ActorLearner, env: Env, fragment_steps: int, num_updates: int) -> Algorithm:
    """The on-device runner's `Algorithm` of a fragment learner: one update rolls out `fragment_steps` steps
    of `al.num_envs` JAX environments with `al.acting` on the learner's current policy (fp32, lag 0) and
    learns from that fragment with the same `al.learn` the actor-learner runner calls on actors' fragments.

    What a compiled loop makes cheap is done once per update, not per step: the fragment's env keys and
    exploration noise (`Acting.noise`) are drawn in one go; where the acting has a critic (`Acting.value`)
    its values are computed while acting, V(final obs) only at steps where some episode was truncated (the
    only place it bootstraps), and handed to the learner in `Step.value`/`next_value`."""
    acting, n = al.acting, al.num_envs
    obs_ndim = len(env.observation_shape)
    slots = np.arange(n, dtype=np.int32)  # (a constant of the programs: jnp's would compile a program here)

    def init(key: jax.Array) -> OnDeviceState:
        key, reset_key, learner_key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, n))
        return OnDeviceState(al.init(learner_key), env_state, obs.astype(jnp.float32), jnp.zeros(n, jnp.float32),
                             jnp.zeros((), jnp.int32), key, None if acting.memory is None else acting.memory.init((n,)))

    def step(carry: tuple[OnDeviceState, Any, Any], inputs: tuple[jax.Array, Any]) -> tuple[tuple, tuple[Step, dict]]:
        state, policy_params, aux = carry
        env_keys, draw = inputs
        x = observe(acting, aux, state.obs)
        raw, memory = network_step(acting, policy_params, x, state.memory, obs_ndim)
        explore = acting.explore if acting.noise is None else acting.explore_with  # draw: a key or noise
        action, extra = explore(raw, draw, state.env_steps, slots, n, aux)
        out = jax.vmap(env.step)(env_keys, state.env_state, acting.to_env(action))
        reward = out.reward.astype(jnp.float32)
        discounted = state.discounted_return
        if acting.return_gamma is not None:
            discounted = acting.return_gamma * discounted + reward
        final_obs = out.final_obs.astype(jnp.float32)
        row = Step(state.obs, action, reward, final_obs, out.terminated, out.truncated,
                   extra, jnp.ones(n, jnp.float32), discounted if acting.return_gamma is not None else None,
                   memory=state.memory)
        if acting.priority is not None:  # Ape-X's initial priorities, from the acting policy (the learner's)
            row = row._replace(priority=acting.priority(forward(acting, policy_params, final_obs, obs_ndim), row))
        if acting.value is not None:  # next_value: V(final obs) where truncated, until `update` completes it
            row = row._replace(**dict(zip(("value", "next_value"), acting_values(acting, policy_params, aux, x, out))))
        discounted = jnp.where(out.terminated | out.truncated, 0.0, discounted)
        if memory is not None:  # an ended episode's env starts the next from the initial state
            memory = reset_carry(memory, out.terminated | out.truncated)
        state = state._replace(env_state=out.state, obs=out.obs.astype(jnp.float32), discounted_return=discounted,
                               env_steps=state.env_steps + n, memory=memory)
        return (state, policy_params, aux), (row, out.info)

    def update(state: OnDeviceState) -> tuple[OnDeviceState, dict[str, jax.Array]]:
        # every step's env keys and exploration noise at once: two random-number programs per update, none per step
        keys = jax.random.split(state.key, 2 + fragment_steps * n)
        key, act_key, env_keys = keys[0], keys[1], keys[2:].reshape((fragment_steps, n, *keys.shape[1:]))
        draws = (jax.random.split(act_key, fragment_steps) if acting.noise is None
                 else acting.noise(act_key, (fragment_steps, n)))
        policy_params = al.policy(state.learner)
        aux = acting_aux(acting, policy_params)
        (state, _, _), (steps, info) = jax.lax.scan(
            step, (state._replace(key=key), policy_params, aux), (env_keys, draws))
        if acting.value is not None:
            last_value = acting.value(policy_params, observe(acting, aux, state.obs))
            steps = steps._replace(next_value=bootstrap_values(steps.value, last_value, steps.truncated,
                                                               steps.next_value))
        learner, metrics = al.learn(state.learner, steps)
        return state._replace(learner=learner), {**episode_metrics(info), **metrics}

    def policy(state: OnDeviceState) -> Any:
        return al.policy(state.learner)

    def act(policy_params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        """The deterministic action for ONE observation, in env units (the key is unused)."""
        del key
        return acting.to_env(acting.greedy(forward(acting, policy_params, obs, obs_ndim)))

    def sample(policy_params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        """The exploring action for ONE observation, in env units."""
        raw = forward(acting, policy_params, obs[None], obs_ndim)
        return acting.to_env(explore_one(acting, raw, key, acting_aux(acting, policy_params)))[0]

    if acting.memory is not None:
        act, sample = recurrent_acts(acting, obs_ndim)
    return Algorithm(init=init, update=update, policy=policy, act=act, env_steps_per_update=fragment_steps * n,
                     num_updates=num_updates, summary=al.summary, sample=sample)


def recurrent_acts(acting: Acting, obs_ndim: int) -> tuple[RecurrentAct, RecurrentAct]:
    """The deterministic and the exploring `RecurrentAct` of a recurrent acting (`Acting.memory`), in env units:
    what `evaluate` steps along episodes."""

    def acts(deterministic: bool) -> RecurrentAct:
        def step(policy_params: Any, obs: jax.Array, keys: jax.Array, memory: Any) -> tuple[jax.Array, Any]:
            aux = acting_aux(acting, policy_params)
            raw, memory = network_step(acting, policy_params, observe(acting, aux, obs), memory, obs_ndim)
            action = acting.greedy(raw) if deterministic else explore_one(acting, raw, keys[0], aux)
            return acting.to_env(action), memory

        return RecurrentAct(acting.memory.kind, lambda n: acting.memory.init((n,)), step)

    return acts(True), acts(False)
