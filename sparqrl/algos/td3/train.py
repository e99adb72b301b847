"""TD3 as an `Agent` of the shared off-policy loop (`sparqrl.algos.offpolicy.loop`), dense or sparse.

Fujimoto et al. 2018 (TD3) with RLx2's settings (Tan et al., ICLR 2023; `rlx2.md` §4-§7).
Behaviour: clip(π(s) + N(0, 0.1²), −1, 1) in the normalised box (the loop maps it to the env's bounds
and takes uniform random actions during warm-up). One gradient step on a batch of n-step windows:

1. target: r^(m) + γ^m · min Q'(s'_m, clip(π'(s'_m) + clip(ε, ±0.5), −1, 1)), ε ~ N(0, 0.2²), at the
   bootstrap state s'_m only (`returns.nstep_q_target`);
2. the twin critic on (Q1 − y)² + (Q2 − y)²;
3. every `policy_delay` gradient steps, the actor on −Q1(s, π(s)) and a Polyak update of both targets.

Sparse methods change only how each network is trained (`sparse.NetTraining`: masks, topology
updates, masked targets) or, for tiny, its widths (`offpolicy.loop.tiny_hidden`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from sparqrl import returns, sparse
from sparqrl.algos import replay_learner
from sparqrl.algos.offpolicy import loop
from sparqrl.algos.offpolicy.loop import Transition
from sparqrl.algos.td3.config import Config
from sparqrl.algos.td3.losses import actor_loss, critic_loss, exploration_action, smoothed_target_action
from sparqrl.lockstep import lockstep_cond
from sparqrl.nets.modules import HeadMLP, TwinCritic, obs_features


class TD3Agent(NamedTuple):
    """TD3's networks, targets and optimizer states (a sparse network's masks live in its optimizer state)."""

    actor: Any
    critic: Any
    actor_target: Any
    critic_target: Any
    actor_opt: optax.OptState
    critic_opt: optax.OptState


# ---- networks ------------------------------------------------------------------------------


class Actor(nn.Module):
    """Deterministic policy obs → tanh(MLP) ∈ [-1, 1]^|A| ([..., |A|])."""

    action_dim: int
    hidden: tuple[int, ...]
    activation: str = "relu"
    obs_ndim: int = 1
    network: str | None = None  # a user's torso (`nets.torso`) before the MLP; None: the flattened obs
    obs_shape: tuple[int, ...] = ()  # (with `network`)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        features = obs_features(obs, self.obs_ndim, self.network, self.obs_shape, 0)
        return jnp.tanh(HeadMLP(self.hidden, self.action_dim, self.activation, "torch")(features))


class Networks(NamedTuple):
    actor: Actor
    critic: TwinCritic


def make_networks(config: Config, env: Any) -> Networks:
    """The actor and twin critic for `env`; tiny narrows them to the sparse networks' weight counts."""

    def actor_at(hidden: tuple[int, ...], num_actions: int, obs_ndim: int) -> Actor:
        return Actor(num_actions, hidden, config.activation, obs_ndim, config.network_of("actor"),
                     tuple(env.observation_shape))

    return Networks(*loop.sized_networks(config, env, actor_at, "torch"))


# ---- the agent ----------------------------------------------------------------------------


def make_agent(config: Config, env: Any) -> loop.Agent:
    """TD3 for a resolved `config` and an env or host spec (`observation_shape`, `action_space`)."""
    nets = make_networks(config, env)
    t_end = config.total_gradient_steps
    actor_training = loop.net_training(config, config.actor_sparsity, config.actor_lr, t_end // config.policy_delay)
    critic_training = loop.net_training(config, config.critic_sparsity, config.critic_lr, t_end)
    example_obs, example_action = loop.examples(env)

    def init(key: jax.Array) -> TD3Agent:
        actor_key, critic_key, actor_mask_key, critic_mask_key = jax.random.split(key, 4)
        actor, actor_opt = actor_training.init(actor_mask_key, nets.actor.init(actor_key, example_obs))
        critic, critic_opt = critic_training.init(
            critic_mask_key, nets.critic.init(critic_key, example_obs, example_action)
        )
        return TD3Agent(actor, critic, actor, critic, actor_opt, critic_opt)  # targets start masked (quirk 13)

    # Actors run the actor's Dense chain (maybe quantized) and squash its output here: tanh(raw).
    network = loop.acting_network(nets.actor, nets.actor.action_dim, "torch")

    def behaviour(raw: jax.Array, eps: jax.Array) -> tuple[jax.Array, jax.Array]:
        action = jnp.tanh(raw)
        return exploration_action(action, eps, config.exploration_noise), action

    def report(agent: TD3Agent) -> dict[str, jax.Array]:
        return loop.sparsity_report(config, actor_training, critic_training, agent.actor_opt, agent.critic_opt)

    gradient_step = make_gradient_step(config, nets, actor_training, critic_training)
    summary = loop.agent_summary(config, env, nets, make_networks, {"actor": actor_training, "critic": critic_training},
                                 stored=["actor", "actor", "critic", "critic"])
    return loop.Agent(init, lambda agent: agent.actor, network, loop.head_params, nets.actor.activation, behaviour,
                      jnp.tanh, gradient_step, report, ("critic_loss", "q_mean", "actor_loss"), summary)


def skip_actor(operand: tuple) -> tuple:
    """The delayed step's other branch: actor and targets as they were, zero loss."""
    agent = operand[0]
    return agent.actor, agent.actor_opt, agent.actor_target, agent.critic_target, jnp.zeros((), jnp.float32)


def make_gradient_step(
    config: Config, nets: Networks, actor_training: sparse.NetTraining, critic_training: sparse.NetTraining,
) -> Callable[..., tuple[TD3Agent, replay_learner.Metrics]]:
    """`loop.Agent.gradient_step`: critic on the smoothed n-step target, then (every `policy_delay` steps)
    actor and targets. The gated branch is a `lockstep_cond` (cheap under vmap when skipped): it takes
    every traced value as an argument and closes over none."""

    def actor_and_targets(operand: tuple) -> tuple:
        """The delayed part of a gradient step: actor on −Q1(s, π(s)), then Polyak updates of both targets."""
        agent, critic, critic_opt, obs, key, actor_updates = operand

        def actor_objective(params: Any) -> jax.Array:
            q1, _ = nets.critic.apply(critic, obs, nets.actor.apply(params, obs))
            return actor_loss(q1)

        a_loss, grads = jax.value_and_grad(actor_objective)(agent.actor)
        step = actor_training.step(key, actor_updates, agent.actor, agent.actor_opt, grads)
        actor_target = actor_training.polyak(step.params, agent.actor_target, config.tau, step.opt_state)
        critic_target = critic_training.polyak(critic, agent.critic_target, config.tau, critic_opt)
        return step.params, step.opt_state, actor_target, critic_target, a_loss

    def gradient_step(
        agent: TD3Agent, batch: Transition, terms: returns.NStepTerms, iteration: jax.Array, key: jax.Array
    ) -> tuple[TD3Agent, replay_learner.Metrics]:
        noise_key, critic_key, actor_key = jax.random.split(key, 3)
        boot_obs = returns.at_index(batch.next_obs, terms.boot_index)
        boot_action = smoothed_target_action(
            nets.actor.apply(agent.actor_target, boot_obs), noise_key, config.target_noise, config.target_noise_clip
        )
        q1_t, q2_t = nets.critic.apply(agent.critic_target, boot_obs, boot_action)
        target = returns.nstep_q_target(terms, jnp.minimum(q1_t, q2_t))
        obs, action = batch.obs[:, 0], batch.action[:, 0]

        def critic_objective(params: Any) -> tuple[jax.Array, jax.Array]:
            q1, q2 = nets.critic.apply(params, obs, action)
            return critic_loss(q1, q2, target), jnp.mean(q1)

        # The gradient w.r.t. the stored (zero-filled) kernels is the dense gradient RigL grows by.
        (c_loss, q_mean), grads = jax.value_and_grad(critic_objective, has_aux=True)(agent.critic)
        critic = critic_training.step(critic_key, iteration, agent.critic, agent.critic_opt, grads)

        do_actor = iteration % config.policy_delay == 0
        actor, actor_opt, actor_target, critic_target, a_loss = lockstep_cond(
            do_actor, actor_and_targets,
            skip_actor, (agent, critic.params, critic.opt_state, obs, actor_key, iteration // config.policy_delay),
        )
        one = jnp.ones((), jnp.float32)
        metrics = {
            "critic_loss": (c_loss, one), "q_mean": (q_mean, one),
            "actor_loss": (a_loss, do_actor.astype(jnp.float32)),
        }
        return TD3Agent(actor, critic.params, actor_target, critic_target, actor_opt, critic.opt_state), metrics

    return gradient_step


make_actor_learner, make_algorithm, make_train = loop.entry_points(make_agent)
