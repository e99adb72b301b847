"""What the actor-critic algorithms (PPO, IMPALA) share: their policy params and how their actors act.

Both train `nets.ActorCritic` (separate actor and critic torsos) and act by sampling its distribution, so
one `Acting` serves both: the actor half (`nets.ActorBranch`, on a subtree of the parameters) gives logits
or the Gaussian mean; `aux` carries what the network does not (the observation statistics, the log-std),
in fp32 whatever precision the network is published in; `extra` is the sample's log-probability under
the copy the actor holds (the behaviour policy's, for PPO's ratio and V-trace's importance weights).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.algos.base import Acting, keyed
from sparqrl.envs import RunningStats, action_dim, is_discrete, normalize
from sparqrl.nets import ActorBranch, ActorCritic, actor_branch_params, torso_features
from sparqrl.nets.memory import Memory, RecurrentActorCritic
from sparqrl.nets.distributions import Categorical, DiagGaussian, categorical, diag_gaussian, sampling_noise


class PolicyParams(NamedTuple):
    """What the policy needs: network parameters and the observation statistics (None: not normalised)."""

    params: Any
    obs_stats: RunningStats | None


def distribution(raw: jax.Array, log_std: jax.Array | None) -> Categorical | DiagGaussian:
    """The policy's distribution from the actor half's output: categorical over logits (log_std None), or
    a diagonal Gaussian with state-independent log-std, as `ActorCritic` builds it."""
    if log_std is None:
        return categorical(raw)
    return diag_gaussian(raw, jnp.exp(log_std) * jnp.ones_like(raw))


def make_acting(network: ActorCritic | RecurrentActorCritic, spec: Any, normalize_obs: bool, return_gamma: float | None,
                with_value: bool = False) -> Acting:
    """Sampling actors for `network` on env `spec`: discrete actions as int32, continuous ones as the raw
    Gaussian sample (its log-probability is of that sample) that `to_env` clips to the action bounds, drawn
    from noise drawn ahead (`Acting.noise`). with_value: the critic as `Acting.value` (PPO's learner takes the
    values `on_device` computes while acting). A `RecurrentActorCritic` acts whole, carrying its state
    (`Acting.memory`), and gives no values while acting: the learner re-runs the fragment for them."""
    discrete = network.discrete
    recurrent = isinstance(network, RecurrentActorCritic)
    branch = network if recurrent else ActorBranch(network.action_dim, tuple(network.obs_shape),
                                                   tuple(network.hidden), network.activation, network.torso,
                                                   network.actor_network)
    if not discrete:
        low, high = np.asarray(spec.action_space.low, np.float32), np.asarray(spec.action_space.high, np.float32)

    def aux(policy_params: PolicyParams) -> dict[str, Any]:
        out = {} if policy_params.obs_stats is None else {"obs_stats": policy_params.obs_stats}
        if not discrete:
            out["log_std"] = policy_params.params["params"]["log_std"]
        return out

    def noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return sampling_noise(key, (*shape, network.action_dim), discrete)

    def explore_with(raw: jax.Array, noise: jax.Array, env_steps: jax.Array, slots: jax.Array, total_slots: int,
                     aux: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
        del env_steps, slots, total_slots  # every env samples alike, from the start
        dist = distribution(raw, aux.get("log_std"))
        action = dist.sample_with_noise(noise)
        return action, dist.log_prob(action)

    def value(policy_params: PolicyParams, x: jax.Array) -> jax.Array:
        return network.apply(policy_params.params, x)[1]

    def greedy(raw: jax.Array) -> jax.Array:
        return jnp.argmax(raw, axis=-1).astype(jnp.int32) if discrete else raw

    def observe(aux: dict[str, Any], obs: jax.Array) -> jax.Array:
        return normalize(aux["obs_stats"], obs)

    return Acting(
        network=branch,
        network_params=(lambda policy_params: policy_params.params) if recurrent
        else lambda policy_params: actor_branch_params(policy_params.params),
        activation=network.activation,
        explore=keyed(noise, explore_with),
        greedy=greedy,
        to_env=(lambda action: action) if discrete else (lambda action: jnp.clip(action, low, high)),
        aux=aux,
        observe=observe if normalize_obs else None,
        return_gamma=return_gamma,
        features=None if network.actor_network or recurrent else torso_features(
            tuple(network.obs_shape), network.activation, network.torso),
        noise=noise,
        explore_with=explore_with,
        value=value if with_value and not recurrent else None,
        memory=Memory(network.memory, network.memory_size) if recurrent else None,
    )


def make_network(config: Any, env: Any) -> ActorCritic | RecurrentActorCritic:
    """The actor-critic network of a PPO/IMPALA/A2C config on `env`: `ActorCritic` (separate actor and critic
    torsos), or with `config.memory` a `RecurrentActorCritic` (the cell after the actor's torso)."""
    common = dict(action_dim=action_dim(env), discrete=is_discrete(env), obs_shape=tuple(env.observation_shape),
                  hidden=tuple(config.hidden), activation=config.activation, torso=config.torso,
                  actor_network=config.network_of("actor"))
    if config.memory != "none":
        return RecurrentActorCritic(memory=config.memory, memory_size=config.memory_size, **common)
    return ActorCritic(critic_network=config.network_of("critic"), **common)
