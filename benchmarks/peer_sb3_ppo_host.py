"""The peer of benchmarks/ppo_host.py: Stable-Baselines3 PPO on a Gymnasium env (CPU torch), with SB3's
default PPO hyperparameters and VecNormalize (observations and rewards).

Runs in the peer venv (`bash benchmarks/setup_peer.sh`), never in sparqrl's:

    .bench-venv/bin/python benchmarks/peer_sb3_ppo_host.py --env HalfCheetah-v5 --steps 300000 --seed 0

Settings (the ones sparqrl's side sets to match, `ppo_host.SETTINGS`): 1 env x 2048 steps, 10 epochs of
minibatches of 64 (32 per epoch), Adam 3e-4 constant, gamma 0.99, GAE lambda 0.95, clip 0.2, no value
clipping, no entropy bonus, value 0.5, grad norm 0.5, separate 64-64 tanh actor and critic, state-
independent log-std from 0; VecNormalize with clip 10 and the discounted-return reward scale. Evaluation:
the deterministic policy with the final observation statistics, raw (unnormalised) rewards. Prints one
JSON object on its last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--eval-episodes", type=int, default=10)
    args = parser.parse_args()

    import gymnasium as gym
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(args.threads)
    env = VecNormalize(make_vec_env(args.env, n_envs=1, seed=args.seed, vec_env_cls=DummyVecEnv),
                       norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, clip_range_vf=None, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                normalize_advantage=True,
                policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
                device="cpu", seed=args.seed, verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger writes to /tmp

    start, cpu_start = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=args.steps)
    learn_s = time.perf_counter() - start
    cores_used = (time.process_time() - cpu_start) / learn_s

    # Deterministic episodes on raw rewards, observations normalised with the final statistics.
    eval_env = gym.make(args.env)
    returns = []
    for episode in range(args.eval_episodes):
        obs, _ = eval_env.reset(seed=args.seed + 10_000 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(env.normalize_obs(obs[None]), deterministic=True)
            obs, reward, terminated, truncated, _ = eval_env.step(action[0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)

    print(json.dumps({
        "peer": "stable-baselines3", "sb3_version": stable_baselines3.__version__, "torch_version": torch.__version__,
        "gymnasium_version": gym.__version__, "torch_threads": torch.get_num_threads(), "env": args.env,
        "seed": args.seed, "steps": int(model.num_timesteps), "learn_s": learn_s,
        "steps_per_s": model.num_timesteps / learn_s, "cores_used": cores_used,
        "eval_returns": returns, "final_return": float(np.mean(returns)),
    }))


if __name__ == "__main__":
    main()
