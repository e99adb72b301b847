"""Pictures of a meta run: fitness.png (fitness over generations) and learned.png (what was learned:
the LPO drift next to PPO-clip's and DPO's, the learned value loss next to L2, or the evolved
hyperparameters relative to their start)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from sparqrl.algos.ppo import objectives
from sparqrl.telemetry.plots import finish_axes, pyplot, save_figure


def _column(rows: list[dict[str, str]], name: str) -> np.ndarray:
    return np.array([float(r[name]) if r.get(name) else np.nan for r in rows])


def plot_fitness(csv_path: Path, png_path: Path, title: str) -> None:
    """Mean fitness with the population's spread (± std), the generation's best and the best so far."""
    plt = pyplot()
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if rows:
        g = _column(rows, "generation")
        mean, std = _column(rows, "mean_fitness"), _column(rows, "std_fitness")
        ax.plot(g, mean, label="population mean")
        ax.fill_between(g, mean - std, mean + std, alpha=0.25, label="± std")
        ax.plot(g, _column(rows, "best_fitness"), label="best of generation", alpha=0.8)
        ax.plot(g, _column(rows, "best_so_far"), label="best so far", linestyle="--")
    finish_axes(ax, "generation", "fitness (episode return)", title)
    save_figure(fig, png_path)


def drift_curves(lpo: objectives.LPOParams, eps: float, alpha: float, beta: float, advantage: float,
                 r: np.ndarray) -> dict[str, np.ndarray]:
    """Drift f(r, A) of the learned network, PPO-clip and DPO at one advantage value, on ratios `r`."""
    r_j = jnp.asarray(r, jnp.float32)
    a = jnp.full_like(r_j, advantage)
    return {
        "learned (LPO)": np.asarray(objectives.lpo_drift(lpo, r_j, a, eps)),
        f"PPO-clip (eps {eps:g})": np.asarray(objectives.ppo_clip_drift(r_j, a, eps)),
        f"DPO (alpha {alpha:g}, beta {beta:g})": np.asarray(objectives.dpo_drift(r_j, a, alpha, beta)),
    }


def value_loss_curves(params: objectives.ValueLossParams, d: np.ndarray) -> dict[str, np.ndarray]:
    """Per-sample loss of the learned value loss (0.5 d^2 + net(d)) and of L2 (0.5 d^2), d = v - t."""
    d_j = jnp.asarray(d, jnp.float32)
    learned = 0.5 * jnp.square(d_j) + objectives.value_loss_network(params, d_j)
    return {"learned": np.asarray(learned), "L2 (0.5 d²)": 0.5 * np.square(d)}


def _mfos_figure(plt: Any, config: Any, center: Any, csv_path: Path) -> Any:
    """M-FOS: both players' mean reward per round over the run, and the learned inner policy's cooperation
    probability per state over one meta-episode against the opponent (a fixed key, 256 games)."""
    import jax

    from sparqrl.meta import mfos

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows:
        g = _column(rows, "generation")
        if config.opponent == mfos.SELF:  # agent 2 against agent 1 or against its own naive learner
            left.plot(g, _column(rows, "meta_return"), label="agent 1")
            left.plot(g, _column(rows, "agent2_return"), label="agent 2")
            if config.self_play_decay > 0 and 1 / config.self_play_decay <= g.max():
                left.axvline(1 / config.self_play_decay, color="k", linestyle=":", label="self-play only from here")
        else:
            left.plot(g, _column(rows, "meta_return"), label="M-FOS")
            left.plot(g, _column(rows, "opponent_return"), label=f"opponent ({config.opponent})")
    x = "meta-episode" if config.trainer == "ppo" else "generation"
    finish_axes(left, x, "mean reward per round", f"{config.game}: both players")
    probs, _, _ = jax.device_get(mfos.cooperation(config, center, jax.random.PRNGKey(0)))
    for i, name in enumerate(mfos.STATE_NAMES[: probs.shape[1]]):
        right.plot(np.arange(1, probs.shape[0] + 1), probs[:, i], label=name if probs.shape[1] > 1 else "cooperate")
    right.set_ylim(-0.02, 1.02)
    finish_axes(right, "meta-step (opponent updates)", "P(cooperate)", "learned inner policy per state")
    return fig


def plot_learned(prepared: Any, center: Any, png_path: Path, summary: dict[str, Any]) -> None:
    """learned.png for the task of `prepared` (`sparqrl.meta.run.Prepared`), `center` its genome; act draws
    its final evaluation's learning curves from `summary`."""
    plt = pyplot()
    task, inner = prepared.task, prepared.task.inner_config
    if task.name == "mfos":
        fig = _mfos_figure(plt, task.inner_config, center, png_path.parent / "fitness.csv")
    elif task.name == "act":
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, label in (("victim", "with the evolved adversary"), ("baseline", "silent (message 0)")):
            curve = summary.get(f"{name}_return_per_update", [])
            ax.plot(np.arange(1, len(curve) + 1), curve, label=label)
        finish_axes(ax, "victim update", "mean episode return",
                    f"PPO victims ({summary.get('final_evaluation_seeds', 0)} seeds, same keys)")
    elif task.name == "lpo":
        r = np.linspace(0.5, 1.5, 201)
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, advantage in zip(axes, (1.0, -1.0)):
            for name, y in drift_curves(center, float(inner.clip_eps), float(inner.dpo_alpha),
                                        float(inner.dpo_beta), advantage, r).items():
                ax.plot(r, y, label=name)
            finish_axes(ax, "probability ratio r", title=f"drift f(r, A), A = {advantage:+g}", legend=False)
        finish_axes(axes[0], ylabel="drift")
    elif task.name == "value-loss":
        d = np.linspace(-3.0, 3.0, 241)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, y in value_loss_curves(center, d).items():
            ax.plot(d, y, label=name)
        finish_axes(ax, "prediction − target", "loss per sample", "learned value loss")
    else:
        values = task.describe_genome(center)
        names = list(values)
        start = [float(getattr(inner, n)) for n in names]
        ratio = [v / s if s else np.nan for v, s in zip(values.values(), start)]
        fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 4))
        ax.bar(names, ratio)
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.set_ylabel("evolved / start value")
        ax.set_title(f"{task.algo} hyperparameters (strategy centre)")
        for i, v in enumerate(values.values()):
            ax.annotate(f"{v:.3g}", (i, ratio[i] if np.isfinite(ratio[i]) else 0), ha="center", va="bottom")
        ax.tick_params(axis="x", rotation=30)
    save_figure(fig, png_path)
