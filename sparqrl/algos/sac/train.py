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

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from sparqrl import returns, sparse
from sparqrl.algos import replay_learner
from sparqrl.algos.offpolicy import loop
from sparqrl.algos.offpolicy.loop import Transition
from sparqrl.algos.sac.config import Config
from sparqrl.algos.sac.losses import actor_loss, bounded_log_std, critic_loss, temperature_loss
from sparqrl.envs import action_dim
from sparqrl.lockstep import lockstep_cond
from sparqrl.nets.distributions import TanhGaussian
from sparqrl.nets.modules import HeadMLP, TwinCritic, obs_features


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
    network: str | None = None  # a user's torso (`nets.torso`) before the MLP; None: the flattened obs
    obs_shape: tuple[int, ...] = ()  # (with `network`)

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        features = obs_features(obs, self.obs_ndim, self.network, self.obs_shape, 0)
        out = HeadMLP(self.hidden, 2 * self.action_dim, self.activation, "orthogonal")(features)
        mean, raw_log_std = jnp.split(out, 2, axis=-1)
        return mean, bounded_log_std(raw_log_std, self.log_std_min, self.log_std_max)


class Networks(NamedTuple):
    actor: Actor
    critic: TwinCritic


def make_networks(config: Config, env: Any) -> Networks:
    """The actor and twin critic for `env`; tiny narrows them to the sparse networks' weight counts."""

    def actor_at(hidden: tuple[int, ...], num_actions: int, obs_ndim: int) -> Actor:
        return Actor(num_actions, hidden, config.activation, obs_ndim, config.log_std_min, config.log_std_max,
                     config.network_of("actor"), tuple(env.observation_shape))

    return Networks(*loop.sized_networks(config, env, actor_at, "orthogonal"))


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

    def report(agent: SACAgent) -> dict[str, jax.Array]:
        return {"alpha": jnp.exp(agent.log_alpha),
                **loop.sparsity_report(config, actor_training, critic_training, agent.actor_opt, agent.critic_opt)}

    network, greedy, behaviour = policy_head(config, nets.actor)
    gradient_step = make_gradient_step(config, env, nets, actor_training, critic_training, alpha_opt)
    summary = loop.agent_summary(config, env, nets, make_networks, {"actor": actor_training, "critic": critic_training},
                                 stored=["actor", "critic", "critic"])
    return loop.Agent(init, lambda agent: agent.actor, network, loop.head_params, nets.actor.activation, behaviour,
                      greedy, gradient_step, report, ("critic_loss", "q_mean", "actor_loss", "entropy"), summary)


def policy_head(config: Config, actor: Actor) -> tuple[HeadMLP, Callable, Callable]:
    """(network, greedy, behaviour) for `loop.Agent`: actors run the actor's Dense chain (maybe quantized);
    its raw output [μ, unbounded log σ] is split here."""
    network = loop.acting_network(actor, 2 * actor.action_dim, "orthogonal")

    def gaussian(raw: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, raw_log_std = jnp.split(raw, 2, axis=-1)
        return mean, bounded_log_std(raw_log_std, config.log_std_min, config.log_std_max)

    def greedy(raw: jax.Array) -> jax.Array:
        return TanhGaussian(*gaussian(raw)).mode()

    def behaviour(raw: jax.Array, eps: jax.Array) -> tuple[jax.Array, jax.Array]:
        policy = TanhGaussian(*gaussian(raw))
        policy_mean = policy.mode()
        if config.behaviour == "sample":
            return policy.sample_with_noise(eps)[0], policy_mean
        return policy_mean, policy_mean

    return network, greedy, behaviour


def grows_with_actor_grad(config: Config, critic_training: sparse.NetTraining) -> bool:
    """Whether the critic's RigL grow score adds the actor-loss gradient (RLx2's quirk 6)."""
    return (
        critic_training.is_sparse and critic_training.schedule.method == "rigl"
        and config.critic_grow_score == "with_actor_grad"
    )


def soft_target(nets: Networks, agent: SACAgent, batch: Transition, terms: returns.NStepTerms,
                key: jax.Array, alpha: jax.Array) -> jax.Array:
    """The n-step soft target [B]: fresh samples of the current policy at every next state of the window
    [B, n] (their log π enter the entropy terms); the bootstrap uses the one at s'_m."""
    mean, log_std = nets.actor.apply(agent.actor, batch.next_obs)
    next_action, next_log_prob = TanhGaussian(mean, log_std).sample(key)
    boot_obs = returns.at_index(batch.next_obs, terms.boot_index)
    boot_action = returns.at_index(next_action, terms.boot_index)
    q1_t, q2_t = nets.critic.apply(agent.critic_target, boot_obs, boot_action)
    return returns.nstep_soft_q_target(terms, jnp.minimum(q1_t, q2_t), alpha, next_log_prob)


def make_actor_step(
    config: Config, env: Any, nets: Networks, actor_training: sparse.NetTraining,
    critic_training: sparse.NetTraining, alpha_opt: optax.GradientTransformation,
) -> Callable[[tuple], tuple]:
    """The gated actor-and-temperature part of a gradient step, a `lockstep_cond` branch: it takes every
    traced value as an argument (operand: agent, critic, obs, key, actor updates, score due) and closes over none."""
    grow_with_actor_grad = grows_with_actor_grad(config, critic_training)
    target_entropy = config.target_entropy(action_dim(env))

    def actor_objective(params: Any, critic: Any, obs: jax.Array, key: jax.Array, alpha: jax.Array) -> tuple:
        """(mean(α log π(a|s) − min Q(s, a)), log π) with a ~ π(·|s) drawn with `key`."""
        mean, log_std = nets.actor.apply(params, obs)
        new_action, log_prob = TanhGaussian(mean, log_std).sample(key)
        q1, q2 = nets.critic.apply(critic, obs, new_action)
        return actor_loss(alpha, log_prob, jnp.minimum(q1, q2)), log_prob

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

    return actor_and_alpha


def skip_actor(operand: tuple) -> tuple:
    """The actor step's other branch: everything as it was, zero loss and entropy."""
    agent = operand[0]
    zero = jnp.zeros((), jnp.float32)
    return agent.actor, agent.actor_opt, agent.log_alpha, agent.alpha_opt, zero, zero, agent.critic_actor_grad


def make_gradient_step(
    config: Config, env: Any, nets: Networks, actor_training: sparse.NetTraining,
    critic_training: sparse.NetTraining, alpha_opt: optax.GradientTransformation,
) -> Callable[..., tuple[SACAgent, replay_learner.Metrics]]:
    """`loop.Agent.gradient_step`: critic on the soft target, then (gated) actor and temperature, then
    (gated) the Polyak update of the target critic. The gated branches are `lockstep_cond`s (cheap under
    vmap when skipped): they take every traced value as an argument and close over none."""
    grow_with_actor_grad = grows_with_actor_grad(config, critic_training)
    actor_and_alpha = make_actor_step(config, env, nets, actor_training, critic_training, alpha_opt)

    def polyak(operand: tuple) -> Any:
        critic, critic_target, critic_opt = operand
        return critic_training.polyak(critic, critic_target, config.tau, critic_opt)

    def gradient_step(
        agent: SACAgent, batch: Transition, terms: returns.NStepTerms, iteration: jax.Array, key: jax.Array
    ) -> tuple[SACAgent, replay_learner.Metrics]:
        target_key, critic_key, actor_key = jax.random.split(key, 3)
        target = soft_target(nets, agent, batch, terms, target_key, jnp.exp(agent.log_alpha))
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

    return gradient_step


make_actor_learner, make_algorithm, make_train = loop.entry_points(make_agent)
