"""Users' own torsos for tests/test_network.py (imported as `own_torsos`, tests/ on sys.path): two that work,
the rest broken on purpose."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

WIDTH = 16  # a module-level constant: not callable


class Small(nn.Module):
    """Two Dense layers with tanh (PPO's default activation: host actors could run it as a Dense chain)."""

    @nn.compact
    def __call__(self, obs):
        x = nn.tanh(nn.Dense(32)(obs.reshape(obs.shape[0], -1)))
        return nn.tanh(nn.Dense(WIDTH)(x))


def wide():
    """A factory: a Dense layer with a LayerNorm (a layer that is not Dense)."""
    return Wide()


class Wide(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return nn.relu(nn.LayerNorm()(nn.Dense(24)(obs.reshape(obs.shape[0], -1))))


def not_a_module():
    return WIDTH


class Rank3(nn.Module):
    """Features [batch, 2, 8]: not [batch, F]."""

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(8)(obs.reshape(obs.shape[0], -1))[:, None, :].repeat(2, axis=1)


class Integers(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return jnp.round(nn.Dense(8)(obs.reshape(obs.shape[0], -1))).astype(jnp.int32)


def raises():
    raise RuntimeError("no torso today")
