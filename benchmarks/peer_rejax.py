"""The peer of benchmarks/vs_rejax.py: rejax 0.1.3's PPO or DQN on gymnax CartPole-v1, CPU JAX.

Runs in the rejax venv (`bash benchmarks/setup_rejax.sh`), never in sparqrl's:

    .bench-rejax-venv/bin/python benchmarks/peer_rejax.py --algo ppo --steps 500000 --seeds 8 [--json OUT]

Prints one JSON object on the last line of stdout (and writes it to --json OUT when given).

What is timed, for 1 seed (`jax.jit(algo.train)(key)`, no vmap) and for --seeds seeds
(`jax.jit(jax.vmap(algo.train))(keys)`), the same way benchmarks/vs_rejax.py times sparqrl:
  compile    `jax.jit(train).trace(key)` (trace_s), `.lower()` (lower_s), `.compile()` (xla_s);
             compile_s is their sum, the first compilation of that program in a fresh process;
  run        the compiled program, `jax.block_until_ready`, best of --repeats executions (run_s);
             env_steps_per_s = steps * seeds / run_s (rejax's `init_state` runs inside `train`, as
             sparqrl's `init` runs inside its whole-run program).
Evaluation is off while timing: rejax's `eval_callback` is replaced by a no-op, its initial
evaluation skipped (`skip_initial_evaluation=True`) and `eval_freq = total_timesteps`, so `train` is
ONE `fori_loop` over all iterations inside a length-1 scan (sparqrl's whole-run program has no
evaluation either). After the timing, --eval-episodes episodes of the trained 1-seed policy are run
with rejax's own `evaluate` (a sanity check that the matched config learns; not timed).

Hyperparameters: sparqrl's defaults, passed in by vs_rejax.py as --config JSON (its `ppo.Config` /
`dqn.Config` as a dict); the defaults below are copies of them for a standalone run. Mapping:

PPO (sparqrl ppo.Config -> rejax PPO field):
  num_envs 4 -> num_envs; num_steps 128 -> num_steps; update_epochs 4 -> num_epochs;
  num_minibatches 4 -> num_minibatches; gamma 0.99 -> gamma; gae_lambda 0.95 -> gae_lambda;
  clip_eps 0.2 -> clip_eps (rejax always clips the value loss too, as sparqrl's clip_value=True);
  ent_coef 0.01 -> ent_coef; vf_coef 0.5 -> vf_coef; max_grad_norm 0.5 -> max_grad_norm;
  lr 2.5e-4 + anneal_lr -> learning_rate = optax.linear_schedule(lr, 0, num_optimizer_steps)
  (rejax's actor and critic optimisers each step once per minibatch, so each anneals over the same
  count as sparqrl's single optimiser); hidden (64, 64) -> agent_kwargs.hidden_layer_sizes;
  activation tanh -> agent_kwargs.activation; normalize_obs/normalize_reward False ->
  normalize_observations/normalize_rewards False; total_timesteps -> total_timesteps (rounded down
  to whole updates, as sparqrl runs them).
  Not matched (rejax has no switch for them):
  - max_grad_norm: rejax applies `optax.clip(0.5)` (clips each gradient ELEMENT to +-0.5) to the
    actor and critic separately; sparqrl clips the global norm of both together.
  - Adam eps: rejax 1e-8 (optax default); sparqrl 1e-5 (PureJaxRL's).
  - one optimiser (sparqrl: one loss, one Adam over actor+critic) vs rejax's two (actor, critic).
  - time-limit truncation: gymnax 0.0.9 returns one `done`, rejax treats it as termination; sparqrl
    bootstraps truncated episodes from V(final_obs) (one extra critic pass per step).

DQN (sparqrl dqn.Config -> rejax DQN field):
  num_envs 10 -> num_envs; buffer_size 10000 -> buffer_size; batch_size 128 -> batch_size;
  lr 2.5e-4 (anneal_lr False) -> learning_rate; gamma 0.99 -> gamma; epsilon_start 1.0 -> eps_start;
  epsilon_finish 0.05 -> eps_end; epsilon_anneal_time 250000 -> exploration_fraction =
  epsilon_anneal_time / total_timesteps; target_update_interval 500 -> target_update_freq;
  tau 1.0 (hard copy) -> polyak = 1 - tau = 0; train_interval 10 with 10 envs (one gradient step per
  10 env steps) -> num_epochs 1 (gradient steps per iteration of num_envs env steps);
  double_dqn False -> ddqn False; max_grad_norm 10 -> max_grad_norm;
  learning_starts 10000 -> fill_buffer = max(learning_starts, batch_size) - num_envs - 1 (rejax
  learns once its step count BEFORE the iteration exceeds fill_buffer, sparqrl once the count AFTER
  it reaches the start, so both take exactly the same number of gradient steps);
  hidden (120, 84) relu: rejax's `create` hard-codes (64, 64), so the agent is replaced after
  `create` by rejax's own `EpsilonGreedyPolicy(DiscreteQNetwork)` with hidden_layer_sizes (120, 84)
  and nn.relu.
  Not matched:
  - max_grad_norm: elementwise `optax.clip(10)` in rejax, global-norm clipping in sparqrl.
  - loss: rejax `optax.l2_loss` = 0.5 * mean squared TD error; sparqrl mean squared TD error
    (the same up to the factor 2 on the gradient, which Adam all but cancels).
  - replay sampling: rejax draws the minibatch WITHOUT replacement (`jax.random.choice(...,
    replace=False, p=...)` over the whole buffer); sparqrl draws with replacement.
  - before learning starts rejax acts uniformly at random (a `lax.cond` skips the network);
    sparqrl acts epsilon-greedily on its schedule from the first step.
  - target update: rejax checks (and may copy) every iteration from the start; sparqrl only once
    learning has started (copies before that change nothing in either).
  - prioritized / priority_* / importance_exponent / apex_*: sparqrl's actor-learner runner only;
    the on-device DQN timed here replays uniformly, like rejax.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

# sparqrl's defaults (sparqrl/algos/ppo/config.py, sparqrl/algos/dqn/config.py); vs_rejax.py passes
# the real ones with --config.
PPO_DEFAULTS = dict(
    total_timesteps=500_000, num_envs=4, num_steps=128, lr=2.5e-4, anneal_lr=True, update_epochs=4,
    num_minibatches=4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, clip_value=True, ent_coef=0.01,
    vf_coef=0.5, max_grad_norm=0.5, hidden=[64, 64], activation="tanh", normalize_obs=False,
    normalize_reward=False,
)
DQN_DEFAULTS = dict(
    total_timesteps=500_000, num_envs=10, buffer_size=10_000, batch_size=128, lr=2.5e-4, anneal_lr=False,
    epsilon_start=1.0, epsilon_finish=0.05, epsilon_anneal_time=250_000, target_update_interval=500,
    tau=1.0, learning_starts=10_000, train_interval=10, gamma=0.99, double_dqn=False, hidden=[120, 84],
    activation="relu", max_grad_norm=10.0,
)


def make_ppo(cfg: dict, steps: int):
    import optax
    from rejax import PPO

    batch = cfg["num_envs"] * cfg["num_steps"]
    num_updates = steps // batch
    total = num_updates * batch
    opt_steps = num_updates * cfg["update_epochs"] * cfg["num_minibatches"]
    lr = optax.linear_schedule(cfg["lr"], 0.0, opt_steps) if cfg["anneal_lr"] else cfg["lr"]
    algo = PPO.create(
        env="CartPole-v1",
        total_timesteps=total,
        eval_freq=total,
        skip_initial_evaluation=True,
        num_envs=cfg["num_envs"],
        num_steps=cfg["num_steps"],
        num_epochs=cfg["update_epochs"],
        num_minibatches=cfg["num_minibatches"],
        learning_rate=lr,
        max_grad_norm=cfg["max_grad_norm"],
        gamma=cfg["gamma"],
        gae_lambda=cfg["gae_lambda"],
        clip_eps=cfg["clip_eps"],
        ent_coef=cfg["ent_coef"],
        vf_coef=cfg["vf_coef"],
        normalize_observations=cfg["normalize_obs"],
        normalize_rewards=cfg["normalize_reward"],
        agent_kwargs={"activation": cfg["activation"], "hidden_layer_sizes": tuple(cfg["hidden"])},
    )
    return algo, total


def make_dqn(cfg: dict, steps: int):
    from flax import linen as nn
    from rejax import DQN
    from rejax.networks import DiscreteQNetwork, EpsilonGreedyPolicy

    if cfg["train_interval"] != cfg["num_envs"]:
        raise SystemExit("rejax's DQN takes num_epochs gradient steps per iteration of num_envs env steps: "
                         "only train_interval == num_envs maps onto it (num_epochs=1)")
    if cfg["anneal_lr"]:
        raise SystemExit("anneal_lr=True is not mapped for DQN")
    n = cfg["num_envs"]
    total = (steps // n) * n
    start = max(cfg["learning_starts"], cfg["batch_size"])
    algo = DQN.create(
        env="CartPole-v1",
        total_timesteps=total,
        eval_freq=total,
        skip_initial_evaluation=True,
        num_envs=n,
        buffer_size=cfg["buffer_size"],
        batch_size=cfg["batch_size"],
        fill_buffer=max(start - n - 1, 0),
        learning_rate=cfg["lr"],
        max_grad_norm=cfg["max_grad_norm"],
        gamma=cfg["gamma"],
        eps_start=cfg["epsilon_start"],
        eps_end=cfg["epsilon_finish"],
        exploration_fraction=cfg["epsilon_anneal_time"] / total,
        target_update_freq=cfg["target_update_interval"],
        polyak=1.0 - cfg["tau"],
        num_epochs=1,
        ddqn=cfg["double_dqn"],
        agent_kwargs={"activation": cfg["activation"]},
    )
    # rejax's DQN.create hard-codes hidden (64, 64): swap in its own network class at sparqrl's widths
    agent = EpsilonGreedyPolicy(DiscreteQNetwork)(
        hidden_layer_sizes=tuple(cfg["hidden"]),
        action_dim=algo.env.action_space(algo.env_params).n,
        activation=getattr(nn, cfg["activation"]),
    )
    return algo.replace(agent=agent), total


def compile_timed(fn, arg) -> tuple[object, dict]:
    import jax

    t0 = time.perf_counter()
    traced = jax.jit(fn).trace(arg)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    return compiled, {"trace_s": t1 - t0, "lower_s": t2 - t1, "xla_s": t3 - t2, "compile_s": t3 - t0}


def run_timed(compiled, arg, repeats: int) -> tuple[object, dict]:
    import jax

    runs, cpu, out = [], [], None
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        out = jax.block_until_ready(compiled(arg))
        runs.append(time.perf_counter() - t0)
        cpu.append((time.process_time() - c0) / runs[-1])
    best = min(range(repeats), key=runs.__getitem__)
    return out, {"run_s": runs[best], "runs_s": runs, "cores_used": cpu[best]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("ppo", "dqn"), default="ppo")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed (rounded down to whole updates)")
    parser.add_argument("--seeds", type=int, default=8, help="seeds of the vmapped run (the 1-seed run is always done)")
    parser.add_argument("--repeats", type=int, default=2, help="executions of each compiled program; the best counts")
    parser.add_argument("--config", default=None, help="sparqrl's Config of --algo as a JSON object (defaults: sparqrl's)")
    parser.add_argument("--eval-episodes", type=int, default=16, help="episodes of rejax's evaluate on the 1-seed "
                        "result after the timing (0: none)")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args()

    warnings.filterwarnings("ignore")
    import_start = time.perf_counter()
    import jax
    import rejax
    from importlib.metadata import version
    from rejax.evaluate import evaluate
    import_s = time.perf_counter() - import_start

    cfg = dict(PPO_DEFAULTS if args.algo == "ppo" else DQN_DEFAULTS)
    if args.config:
        given = json.loads(args.config)
        cfg.update({k: v for k, v in given.items() if k in cfg})
    make = make_ppo if args.algo == "ppo" else make_dqn
    build_start = time.perf_counter()
    algo, total = make(cfg, args.steps)
    build_s = time.perf_counter() - build_start
    # no evaluation while timing (see the docstring)
    algo = algo.replace(eval_callback=lambda algo, ts, rng: ())

    key = jax.random.PRNGKey(0)
    keys = jax.random.split(jax.random.PRNGKey(1), args.seeds)
    result = {
        "peer": "rejax",
        "algo": args.algo,
        "env": "CartPole-v1 (gymnax)",
        "steps": total,
        "config": cfg,
        "versions": {name: version(name) for name in ("rejax", "gymnax", "jax", "jaxlib", "flax", "optax")},
        "device": f"{jax.devices()[0].device_kind} x{jax.device_count()} ({jax.default_backend()})",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "import_s": import_s,
        "build_s": build_s,
    }

    compiled, comp = compile_timed(algo.train, key)
    out, run = run_timed(compiled, key, args.repeats)
    result["one_seed"] = {**comp, **run, "seeds": 1, "env_steps_per_s": total / run["run_s"]}
    if args.eval_episodes > 0:
        ts = out[0]
        lengths, returns = evaluate(algo.make_act(ts), jax.random.PRNGKey(2), algo.env, algo.env_params,
                                    args.eval_episodes, algo.env_params.max_steps_in_episode)
        result["one_seed"]["final_return"] = float(returns.mean())
    del compiled, out

    compiled, comp = compile_timed(jax.vmap(algo.train), keys)
    _, run = run_timed(compiled, keys, args.repeats)
    result["many_seeds"] = {**comp, **run, "seeds": args.seeds,
                            "env_steps_per_s": total * args.seeds / run["run_s"]}

    line = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
