"""SAC as an `Agent` of the shared off-policy loop (`sparqrl.algos.offpolicy.loop`), dense or sparse.

Haarnoja et al. 2018 (SAC with automatic entropy tuning) with RLx2's settings (Tan et al., ICLR 2023;
`rlx2.md` §4-§7). Behaviour: the mean action tanh(μ(s)) (RLx2's code; `behaviour="sample"` draws
a ~ π(·|s)); the loop maps it to the env's bounds and takes uniform random actions during warm-up.
One gradient step on a batch of n-step windows:

1. the critic on the (delayed) n-step soft target, with fresh actions of the current policy at every
   next state of the window (`returns.nstep_soft_q_target`);
2. every `actor_update_interval` steps, the actor (against the just-updated critic) and the temperature;
3. every `target_update_interval` steps, a Polyak update of the target critic. SAC has no actor target.

Sparse methods change only how each network is trained (`sparse.NetTraining`) or, for tiny, its widths.
The critic's RigL grow score adds, as RLx2's code does (quirk 6), the actor-loss gradient w.r.t. the
critic weights of the iteration before the topology update (`critic_grow_score`; the actor step of
that iteration computes it, and only that one).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from sparqrl import returns
from sparqrl.algos import replay_learner
from sparqrl.algos.base import ActorLearner, Algorithm, has_tracers, make_hparams_train_fn, on_device
from sparqrl.algos.offpolicy import loop
from sparqrl.algos.offpolicy.loop import Transition
from sparqrl.algos.sac.config import Config
from sparqrl.algos.sac.losses import (
    actor_loss, bounded_log_std, critic_loss, sample_squashed_gaussian, temperature_loss,
)
from sparqrl.envs import Env, action_dim
from sparqrl.lockstep import lockstep_cond
from sparqrl.nets.modules import HeadMLP, TwinCritic, flatten_obs


class SACAgent(NamedTuple):
    """SAC's networks, target critic, temperature and optimizer states (masks live in the optimizer states)."""

    actor: Any
    critic: Any
    critic_target: Any
    log_alpha: jax.Array  # float32 []
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    alpha_opt: optax.OptState
    critic_actor_grad: Any  # d(actor loss)/d(critic) of the last actor step before a critic topology update


# ---- networks ------------------------------------------------------------------------------


class Actor(nn.Module):
    """Gaussian policy head obs → (μ [..., |A|], log σ [..., |A|]) before the tanh squashing.

    One MLP with 2|A| outputs (RLx2 / pytorch_sac); log σ is softly bounded to (log_std_min, log_std_max).
    """

    action_dim: int
    hidden: tuple[int, ...]
    activation: str = "relu"
    obs_ndim: int = 1
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = HeadMLP(self.hidden, 2 * self.action_dim, self.activation, "orthogonal")(flatten_obs(obs, self.obs_ndim))
        mean, raw_log_std = jnp.split(out, 2, axis=-1)
        return mean, bounded_log_std(raw_log_std, self.log_std_min, self.log_std_max)


class Networks(NamedTuple):
    actor: Actor
    critic: TwinCritic


def make_networks(config: Config, env: Any) -> Networks:
    """The actor and twin critic for `env`; tiny narrows them to the sparse networks' weight counts."""
    obs_ndim = len(env.observation_shape)
    num_actions = action_dim(env)

    def actor_at(hidden: tuple[int, ...]) -> Actor:
        return Actor(num_actions, hidden, config.activation, obs_ndim, config.log_std_min, config.log_std_max)

    def critic_at(hidden: tuple[int, ...]) -> TwinCritic:
        return TwinCritic(hidden, config.activation, obs_ndim, "orthogonal")

    return Networks(*loop.sized_networks(config, env, actor_at, critic_at))


# ---- the agent ----------------------------------------------------------------------------


def make_agent(config: Config, env: Any) -> loop.Agent:
    """SAC for a resolved `config` and an env or host spec (`observation_shape`, `action_space`)."""
    nets = make_networks(config, env)
    t_end = config.total_gradient_steps
    actor_training = loop.net_training(
        config, config.actor_sparsity, config.actor_lr, t_end // config.actor_update_interval
    )
    critic_training = loop.net_training(config, config.critic_sparsity, config.critic_lr, t_end)
    alpha_opt = optax.adam(config.alpha_lr)
    grow_with_actor_grad = (
        critic_training.is_sparse and critic_training.schedule.method == "rigl"
        and config.critic_grow_score == "with_actor_grad"
    )
    target_entropy = config.target_entropy(action_dim(env))
    example_obs, example_action = loop.examples(env)

    def init_params(key: jax.Array) -> tuple[Any, Any]:
        actor_key, critic_key = jax.random.split(key)
        return nets.actor.init(actor_key, example_obs), nets.critic.init(critic_key, example_obs, example_action)

    def init(key: jax.Array) -> SACAgent:
        params_key, actor_mask_key, critic_mask_key = jax.random.split(key, 3)
        actor_params, critic_params = init_params(params_key)
        actor, actor_opt = actor_training.init(actor_mask_key, actor_params)
        critic, critic_opt = critic_training.init(critic_mask_key, critic_params)
        log_alpha = jnp.log(jnp.asarray(config.init_alpha, jnp.float32))
        return SACAgent(actor, critic, critic, log_alpha, actor_opt, critic_opt, alpha_opt.init(log_alpha),
                        jax.tree.map(jnp.zeros_like, critic))

    # Actors run the actor's Dense chain (maybe quantized); its raw output [μ, unbounded log σ] is split here.
    network = HeadMLP(nets.actor.hidden, 2 * nets.actor.action_dim, nets.actor.activation, "orthogonal")

    def network_params(actor_params: Any) -> Any:
        return {"params": actor_params["params"]["HeadMLP_0"]}

    def gaussian(raw: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, raw_log_std = jnp.split(raw, 2, axis=-1)
        return mean, bounded_log_std(raw_log_std, config.log_std_min, config.log_std_max)

    def greedy(raw: jax.Array) -> jax.Array:
        return jnp.tanh(gaussian(raw)[0])

    def behaviour(raw: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, log_std = gaussian(raw)
        policy_mean = jnp.tanh(mean)
        if config.behaviour == "sample":
            return sample_squashed_gaussian(key, mean, log_std)[0], policy_mean
        return policy_mean, policy_mean

    def actor_objective(params: Any, critic: Any, obs: jax.Array, key: jax.Array, alpha: jax.Array) -> tuple:
        """(mean(α log π(a|s) − min Q(s, a)), log π) with a ~ π(·|s) drawn with `key`."""
        mean, log_std = nets.actor.apply(params, obs)
        new_action, log_prob = sample_squashed_gaussian(key, mean, log_std)
        q1, q2 = nets.critic.apply(critic, obs, new_action)
        return actor_loss(alpha, log_prob, jnp.minimum(q1, q2)), log_prob

    # The gated branches are `lockstep_cond`s (cheap under vmap when skipped): they take every traced
    # value as an argument and close over none.

    def actor_and_alpha(operand: tuple) -> tuple:
        """Actor on mean(α log π − min Q) against the just-updated critic, then the temperature."""
        agent, critic, obs, key, actor_updates, score_due = operand
        sample_key, topology_key = jax.random.split(key)
        alpha = jnp.exp(agent.log_alpha)

        (a_loss, log_prob), grads = jax.value_and_grad(actor_objective, has_aux=True)(
            agent.actor, critic, obs, sample_key, alpha
        )
        critic_actor_grad = agent.critic_actor_grad
        if grow_with_actor_grad:  # only before a critic topology update: the extra backward is not free
            critic_actor_grad = lockstep_cond(
                score_due, lambda op: jax.grad(lambda c: actor_objective(op[0], c, *op[3:])[0])(op[1]),
                lambda op: op[2], (agent.actor, critic, critic_actor_grad, obs, sample_key, alpha),
            )
        step = actor_training.step(topology_key, actor_updates, agent.actor, agent.actor_opt, grads)
        log_alpha, alpha_opt_state = agent.log_alpha, agent.alpha_opt
        if config.learn_alpha:
            alpha_grad = jax.grad(temperature_loss)(agent.log_alpha, log_prob, target_entropy)
            alpha_update, alpha_opt_state = alpha_opt.update(alpha_grad, alpha_opt_state, log_alpha)
            log_alpha = optax.apply_updates(log_alpha, alpha_update)
        return (step.params, step.opt_state, log_alpha, alpha_opt_state, a_loss, -jnp.mean(log_prob),
                critic_actor_grad)

    def skip_actor(operand: tuple) -> tuple:
        agent = operand[0]
        zero = jnp.zeros((), jnp.float32)
        return (agent.actor, agent.actor_opt, agent.log_alpha, agent.alpha_opt, zero, zero,
                agent.critic_actor_grad)

    def polyak(operand: tuple) -> Any:
        critic, critic_target, critic_opt = operand
        return critic_training.polyak(critic, critic_target, config.tau, critic_opt)

    def gradient_step(
        agent: SACAgent, batch: Transition, terms: returns.NStepTerms, iteration: jax.Array, key: jax.Array
    ) -> tuple[SACAgent, replay_learner.Metrics]:
        target_key, critic_key, actor_key = jax.random.split(key, 3)
        alpha = jnp.exp(agent.log_alpha)

        # Soft target: fresh samples of the current policy at every next state of the window [B, n];
        # the bootstrap uses the one at s'_m.
        mean, log_std = nets.actor.apply(agent.actor, batch.next_obs)
        next_action, next_log_prob = sample_squashed_gaussian(target_key, mean, log_std)
        boot_obs = returns.at_index(batch.next_obs, terms.boot_index)
        boot_action = returns.at_index(next_action, terms.boot_index)
        q1_t, q2_t = nets.critic.apply(agent.critic_target, boot_obs, boot_action)
        target = returns.nstep_soft_q_target(terms, jnp.minimum(q1_t, q2_t), alpha, next_log_prob)
        obs, action = batch.obs[:, 0], batch.action[:, 0]

        def critic_objective(params: Any) -> tuple[jax.Array, jax.Array]:
            q1, q2 = nets.critic.apply(params, obs, action)
            return critic_loss(q1, q2, target), jnp.mean(q1)

        (c_loss, q_mean), grads = jax.value_and_grad(critic_objective, has_aux=True)(agent.critic)
        grow_grads = jax.tree.map(jnp.add, grads, agent.critic_actor_grad) if grow_with_actor_grad else None
        critic = critic_training.step(critic_key, iteration, agent.critic, agent.critic_opt, grads, grow_grads)

        do_actor = iteration % config.actor_update_interval == 0
        score_due = critic_training.schedule.should_update(iteration + 1)  # the critic's next update
        actor, actor_opt, log_alpha, alpha_opt_state, a_loss, entropy, critic_actor_grad = lockstep_cond(
            do_actor, actor_and_alpha, skip_actor,
            (agent, critic.params, obs, actor_key, iteration // config.actor_update_interval, score_due),
        )
        critic_target = lockstep_cond(
            iteration % config.target_update_interval == 0, polyak, lambda op: op[1],
            (critic.params, agent.critic_target, critic.opt_state),
        )
        one, actor_weight = jnp.ones((), jnp.float32), do_actor.astype(jnp.float32)
        metrics = {
            "critic_loss": (c_loss, one), "q_mean": (q_mean, one),
            "actor_loss": (a_loss, actor_weight), "entropy": (entropy, actor_weight),  # −mean log π of the actor's batch
        }
        new_agent = SACAgent(actor, critic.params, critic_target, log_alpha, actor_opt, critic.opt_state,
                             alpha_opt_state, critic_actor_grad)
        return new_agent, metrics

    def report(agent: SACAgent) -> dict[str, jax.Array]:
        out = {"alpha": jnp.exp(agent.log_alpha)}
        if config.masked:
            out["actor_sparsity"] = actor_training.measured_sparsity(agent.actor_opt)
            out["critic_sparsity"] = critic_training.measured_sparsity(agent.critic_opt)
        return out

    summary = loop.sparse_summary(
        config, loop.network_shapes(*nets, env),
        loop.network_shapes(*make_networks(dataclasses.replace(config, sparse="dense"), env), env),
        {"actor": actor_training, "critic": critic_training}, stored=["actor", "critic", "critic"],
    )
    return loop.Agent(init, lambda agent: agent.actor, network, network_params, nets.actor.activation, behaviour,
                      greedy, gradient_step, report, ("critic_loss", "q_mean", "actor_loss", "entropy"), summary)


def make_actor_learner(config: Config, env: Any) -> ActorLearner:
    """The learner and acting halves for the actor-learner runner; checks and resolves the config first."""
    config = config.validate(env)
    return loop.make_offpolicy(config, env, make_agent(config, env))


def make_algorithm(config: Config, env: Env) -> Algorithm:
    """SAC on device for `env` (continuous actions). The config is checked here, on the host, before any tracing."""
    if not has_tracers(config):
        config = config.validate(env)
    return on_device(loop.make_offpolicy(config, env, make_agent(config, env)), env, 1, config.num_updates)


def make_train(config: Config, env: Env) -> Callable[[jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """The whole run as `train(key, hparams=None) -> (state, metrics [num_updates])` (`base.make_hparams_train_fn`)."""
    return make_hparams_train_fn(make_algorithm, config.validate(env), env)
