"""The peer of benchmarks/ppo_cartpole.py: Stable-Baselines3 PPO on gymnasium CartPole-v1, CPU torch.

Runs in the peer venv (`bash benchmarks/setup_peer.sh`), never in sparqrl's:

    .bench-venv/bin/python benchmarks/peer_sb3_ppo.py --steps 50000 --seed 0 --threads 2

Hyperparameters are PureJaxRL's CartPole defaults, the same as sparqrl's `ppo.Config()`:
4 envs x 128 steps, 4 epochs of 4 minibatches (batch_size 128), Adam 2.5e-4 annealed linearly to 0,
gamma 0.99, GAE lambda 0.95, clip 0.2 (policy and value), entropy 0.01, value 0.5, grad norm 0.5,
separate 64-64 tanh actor and critic. Prints one JSON object on its last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps of the timed learn() call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the machine's cores)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    args = parser.parse_args()

    import_start = time.perf_counter()
    import gymnasium as gym
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(args.threads)
    import_s = time.perf_counter() - import_start

    lr = 2.5e-4
    setup_start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=4, seed=args.seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=128,
        batch_size=128,  # 512 transitions per update / 4 minibatches
        n_epochs=4,
        learning_rate=lambda progress_remaining: lr * progress_remaining,  # 1 -> 0 over the run
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        clip_range_vf=0.2,  # PureJaxRL (and sparqrl by default) clip the value loss too
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_advantage=True,
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
        device="cpu",
        seed=args.seed,
        verbose=0,
    )
    # A logger with no outputs: SB3's default one makes a folder in /tmp on every learn().
    model.set_logger(Logger(folder=None, output_formats=[]))
    setup_s = time.perf_counter() - setup_start

    learn_start, cpu_start = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=args.steps)
    learn_s = time.perf_counter() - learn_start
    cores_used = (time.process_time() - cpu_start) / learn_s  # CPU seconds per second: cores it had
    steps = int(model.num_timesteps)  # learn() runs whole rollouts: a multiple of 512 at or above --steps

    eval_env = Monitor(gym.make("CartPole-v1"))
    eval_env.reset(seed=args.seed + 10_000)
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True,
                                 return_episode_rewards=True)

    print(json.dumps({
        "peer": "stable-baselines3",
        "sb3_version": stable_baselines3.__version__,
        "torch_version": torch.__version__,
        "gymnasium_version": gym.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": "cpu",
        "seed": args.seed,
        "requested_steps": args.steps,
        "steps": steps,
        "import_s": import_s,
        "setup_s": setup_s,
        "learn_s": learn_s,
        "steps_per_s": steps / learn_s,
        "cores_used": cores_used,
        "eval_returns": [float(r) for r in returns],
        "final_return": float(sum(returns) / len(returns)),
    }))


if __name__ == "__main__":
    main()
