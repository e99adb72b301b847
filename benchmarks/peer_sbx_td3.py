"""The peer of sparqrl's TD3 learner speed: sbx-rl (Stable-Baselines-Jax) TD3 gradient updates per second.

Runs in the peer venv (`bash benchmarks/setup_peer.sh`), never in sparqrl's:

    .bench-venv/bin/python benchmarks/peer_sbx_td3.py --env HalfCheetah-v5 --updates 20000 \
        --batch-size 256 --repeats 3 --json OUT.json

What it measures: the learner alone. One update = one critic step on a batch of `--batch-size`
(twin critics, 256-256 ReLU, as is the actor), with the actor step every 2nd update (policy_delay=2),
target smoothing noise 0.2 clipped at 0.5, gamma 0.99, Adam 3e-4. sbx's own schedule, which cannot
be configured away: it Polyak-averages BOTH target networks (tau 0.005) after EVERY critic step, not
only on the actor's steps.

How: TD3 is built on the Gymnasium env and its replay buffer filled by `learn()` with random actions
only (learning_starts = the fill, so no training happens there). Then `model.train(gradient_steps=k,
batch_size)` is called `updates / k` times and timed, after warm-up calls that compile it, until the
new parameters are ready (`jax.block_until_ready`); the best of `--repeats` counts. `warmup_s` is
the warm-up calls in full (they run updates too); `compile_s` is that less their updates at the best
rate. `cores_used` is process CPU time over wall time during the best timed repeat. `k` is
`--steps-per-call`: by default all `--updates` in one call (sbx's fastest path); `--steps-per-call 1`
is what `learn()` does with sbx's default train_freq=1, gradient_steps=1 (one call per env step).

Each train() call samples k * batch_size transitions on the host (SB3's numpy ReplayBuffer, copied
through torch tensors; HalfCheetah's observations are stored as float64), hands them to one jitted
function that runs a `lax.fori_loop` over the k updates (critic step, soft target update, actor step
under `lax.cond`), and reads the two losses back with `.item()`. All of that is inside the timing:
it is the learner's cost as sbx users run it. The sampling alone is also timed (`sample_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--updates", type=int, default=20_000, help="gradient updates per timed repeat")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the best counts")
    parser.add_argument("--steps-per-call", type=int, default=0,
                        help="gradient steps per train() call (default 0: all --updates in one call)")
    parser.add_argument("--fill", type=int, default=10_000, help="random-action transitions in the buffer")
    parser.add_argument("--threads", type=int, default=0,
                        help="pin the process to this many cores (and torch to as many threads); 0: all cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    per_call = args.steps_per_call or args.updates
    if args.updates % per_call:
        parser.error("--updates must be a multiple of --steps-per-call")
    if args.threads:  # before jax starts its thread pools: XLA's CPU flags do not bound them, affinity does
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])

    import gymnasium as gym
    import jax
    import sbx
    import torch
    from sbx import TD3

    if args.threads:
        torch.set_num_threads(args.threads)

    model = TD3("MlpPolicy", gym.make(args.env), learning_rate=3e-4, buffer_size=max(args.fill, 100_000),
                learning_starts=args.fill, batch_size=args.batch_size, tau=0.005, gamma=0.99,
                policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5,
                policy_kwargs=dict(net_arch=[256, 256], n_critics=2), seed=args.seed)
    fill_start = time.perf_counter()
    model.learn(total_timesteps=args.fill)  # random actions only: num_timesteps never exceeds learning_starts
    fill_s = time.perf_counter() - fill_start
    assert model.replay_buffer.size() >= args.fill and model._n_updates == 0

    def run(calls: int) -> None:
        for _ in range(calls):
            model.train(gradient_steps=per_call, batch_size=args.batch_size)
        jax.block_until_ready((model.policy.qf_state, model.policy.actor_state))

    # The jitted step is specialised on gradient_steps and on (n_updates + 1) % policy_delay, so an odd
    # steps-per-call alternates between two compilations: warm up both.
    warm_calls = 1 if per_call % 2 == 0 else 2
    warm_start = time.perf_counter()
    run(warm_calls)
    warmup_s = time.perf_counter() - warm_start

    timings, cpu = [], []
    for _ in range(args.repeats):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        run(args.updates // per_call)
        timings.append(time.perf_counter() - wall0)
        cpu.append(time.process_time() - cpu0)
    best = min(range(args.repeats), key=timings.__getitem__)
    compile_s = warmup_s - warm_calls * per_call * timings[best] / args.updates  # warm-up less its updates

    sample_start = time.perf_counter()
    model.replay_buffer.sample(per_call * args.batch_size)
    sample_s = time.perf_counter() - sample_start

    result = {
        "peer": "sbx-rl", "version": sbx.__version__, "jax_version": jax.__version__,
        "backend": jax.default_backend(), "env": args.env, "batch_size": args.batch_size,
        "updates": args.updates, "steps_per_call": per_call,
        "updates_per_s": args.updates / timings[best], "warmup_s": warmup_s, "compile_s": compile_s,
        "fill_s": fill_s,
        "timings_s": timings, "cores_used": cpu[best] / timings[best],
        "sample_s": sample_s, "cores_allowed": len(os.sched_getaffinity(0)),
        "note": ("sbx TD3.train(gradient_steps=k) samples k*batch transitions on the host per call (SB3 numpy "
                 "ReplayBuffer via torch tensors, float64 obs), then one jitted lax.fori_loop over the k updates: "
                 "critic step + Polyak update of both targets every update, actor step every 2nd via lax.cond; "
                 "losses read back with .item() per call. Host sampling and the transfer are inside the timing; "
                 f"sample_s is the sampling of one call ({per_call} x {args.batch_size}) alone."),
    }
    print(f"sbx-rl {sbx.__version__} TD3 on {args.env} (jax {jax.__version__}): "
          f"{result['updates_per_s']:,.0f} updates/s, batch {args.batch_size}, {per_call} steps per train() call, "
          f"best of {args.repeats} x {args.updates:,} updates ({min(timings):.2f} s), warm-up {warmup_s:.1f} s "
          f"(compile ~{compile_s:.1f} s), "
          f"{result['cores_used']:.2f} cores used")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
