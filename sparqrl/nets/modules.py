"""Flax modules. Orthogonal initialisation with gain sqrt(2) for hidden layers (PPO convention)."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.nets.activations import ACTIVATIONS
from sparqrl.nets.distributions import Categorical, DiagGaussian, categorical, diag_gaussian
from sparqrl.nets.torso import TORSO_NAMES, UserTorso


def sequential_under_vmap(fn: Callable) -> Callable:
    """`fn(key)` that, when vmapped, runs once per key in a `lax.map` instead of as one batched program.

    Why: Flax's orthogonal initialiser calls LAPACK QR. Batched (vmapped over seeds), jaxlib 0.10's CPU
    QR kernel (`ParallelBatchMap`) runs on a thread of XLA's intra-op pool, queues the batch's parts on
    the same pool and blocks that thread until they finish. Two such QRs at once (actor and critic of one
    program, or one per device when the seeds are spread over forced CPU devices) can take every thread
    of the pool (one per core) and wait forever for parts that no free thread is left to run. One QR
    per map iteration is not split, so it never waits. Initialisation is a negligible part of a run.
    """
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def _rule(axis_size: int, in_batched: list[bool], key: jax.Array):
        del axis_size
        out = jax.lax.map(wrapped, key) if in_batched[0] else wrapped(key)
        return out, jax.tree.map(lambda _: in_batched[0], out)

    return wrapped


def orthogonal(gain: float) -> Callable[..., jax.Array]:
    """Flax's orthogonal initialiser with its QR never batched: vmapped (over seeds, settings, a
    population), each kernel is drawn in a `lax.map` (`sequential_under_vmap`). Every orthogonal kernel
    of sparqrl's networks is drawn through here, so no algorithm has to remember it: with several CPU
    devices (the CLI's seed spreading) each device's batched QR held one of the pool's threads waiting
    for work queued behind the other's, and the run hung before its first line (DQN, 4 seeds on 2
    devices)."""
    draw = nn.initializers.orthogonal(gain)

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        return sequential_under_vmap(lambda k: draw(k, shape, dtype))(key)

    return init


def dense(features: int, gain: float = float(np.sqrt(2.0))) -> nn.Dense:
    return nn.Dense(features, kernel_init=orthogonal(gain), bias_init=nn.initializers.zeros)


def flatten_obs(obs: jax.Array, obs_ndim: int) -> jax.Array:
    """[..., *obs_shape] -> [..., prod(obs_shape)]: extra leading axes are batch axes."""
    return obs.reshape(obs.shape[: obs.ndim - obs_ndim] + (-1,))


def init_dense(scheme: str, features: int, fan_in: int) -> nn.Dense:
    """A Dense layer initialised as RLx2's reference code does:
    'torch' (its TD3): PyTorch's default Linear init, weights and biases U(−1/√fan_in, 1/√fan_in);
    'orthogonal' (its SAC): orthogonal weights with gain 1, zero biases."""
    if scheme == "orthogonal":
        return nn.Dense(features, kernel_init=orthogonal(1.0), bias_init=nn.initializers.zeros)
    bound = 1.0 / float(np.sqrt(fan_in))

    def bias_init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return nn.Dense(features, kernel_init=nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),
                    bias_init=bias_init)


def obs_features(obs: jax.Array, obs_ndim: int, network: str | None, obs_shape: tuple[int, ...], index: int
                 ) -> jax.Array:
    """Inside a compact method: the flattened observation [..., d], or the features [..., F] of a user's torso
    (`network`) named as network `index`'s (`TORSO_NAMES`): what TD3's and SAC's MLPs take."""
    if network is None:
        return flatten_obs(obs, obs_ndim)
    return UserTorso(network, tuple(obs_shape), name=TORSO_NAMES[index])(obs)


class HeadMLP(nn.Module):
    """Hidden Dense + activation layers, then a linear output layer of `out` units ([..., out])."""

    hidden: tuple[int, ...]
    out: int
    activation: str
    scheme: str  # see `init_dense` (a field may not be called `init`: flax's Module.init)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = ACTIVATIONS[self.activation].jax(init_dense(self.scheme, width, x.shape[-1])(x))
        return init_dense(self.scheme, self.out, x.shape[-1])(x)


class TorsoHead(nn.Module):
    """A user's torso (`nets.torso`) then a `HeadMLP`: TD3's and SAC's actor before its squashing, with the
    actor's parameter names ('Torso_0', 'HeadMLP_0'), on flat or shaped observations: what their actors run."""

    network: str
    obs_shape: tuple[int, ...]
    hidden: tuple[int, ...]
    out: int
    activation: str
    scheme: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = obs_features(x, len(self.obs_shape), self.network, self.obs_shape, 0)
        return HeadMLP(self.hidden, self.out, self.activation, self.scheme)(features)


class TwinCritic(nn.Module):
    """Two Q-networks (obs, action) → (Q1 [...], Q2 [...]) in one module (one parameter tree, as RLx2's
    critic, whose 6 weight matrices share one sparsity allocation)."""

    hidden: tuple[int, ...]
    activation: str = "relu"
    obs_ndim: int = 1
    scheme: str = "torch"  # see `init_dense`
    network: str | None = None  # a user's torso (`nets.torso`): both Q-networks take its features of obs
    obs_shape: tuple[int, ...] = ()  # (with `network`)

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jnp.concatenate([obs_features(obs, self.obs_ndim, self.network, self.obs_shape, 1), action], axis=-1)
        q1 = HeadMLP(self.hidden, 1, self.activation, self.scheme, name="q1")(x)[..., 0]
        q2 = HeadMLP(self.hidden, 1, self.activation, self.scheme, name="q2")(x)[..., 0]
        return q1, q2


class MLP(nn.Module):
    """Flattens all but the batch axes of the observation, then hidden Dense + activation layers."""

    hidden: Sequence[int]
    activation: str = "tanh"
    obs_ndim: int = 1  # rank of one observation; extra leading axes are batch axes

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = flatten_obs(x, self.obs_ndim)
        for width in self.hidden:
            x = ACTIVATIONS[self.activation].jax(dense(width)(x))
        return x


# Convolution layers (features, kernel, stride, padding) of the image torsos, and the scale of their input.
CONV_LAYERS: dict[str, tuple[tuple[int, int, int, str], ...]] = {
    "minatar": ((16, 3, 1, "SAME"),),  # MinAtar's baseline network (Young & Tian 2019)
    "nature": ((32, 8, 4, "VALID"), (64, 4, 2, "VALID"), (64, 3, 1, "VALID")),  # Mnih et al. 2015
}
CONV_INPUT_SCALE = {"minatar": 1.0, "nature": 1.0 / 255.0}  # MinAtar grids are 0/1; Atari pixels 0..255
NATURE_MIN_SIZE = 36  # the smallest side the Nature convolutions leave a 1x1 map of


def conv_features(x: jax.Array, kind: str, activation: str) -> jax.Array:
    """[..., H, W, C] -> [..., F]: `CONV_LAYERS[kind]`, each followed by `activation`, flattened. Called inside a
    compact method, so the layers are that module's 'Conv_0', 'Conv_1', ... (`ConvFeatures` runs them alone)."""
    batch_shape = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:]).astype(jnp.float32) * CONV_INPUT_SCALE[kind]
    for features, kernel, stride, padding in CONV_LAYERS[kind]:
        conv = nn.Conv(features, (kernel, kernel), (stride, stride), padding=padding,
                       kernel_init=orthogonal(float(np.sqrt(2.0))))
        x = ACTIVATIONS[activation].jax(conv(x))
    return x.reshape(batch_shape + (-1,))


class ConvFeatures(nn.Module):
    """The convolution part of a CNN torso alone: applied to the torso's own variables it gives the flat
    features its first Dense layer takes (host actors run it in fp32 before their Dense chain)."""

    kind: str
    activation: str = "relu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return conv_features(x, self.kind, self.activation)


class _ConvTorso(nn.Module):
    """`CONV_LAYERS[KIND]`, then the MLP. Subclasses only name the kind: a torso's parameters are named after
    its class ('MinAtarCNN_0', 'NatureCNN_0'), so each kind keeps a class of its own."""

    KIND: ClassVar[str] = ""
    hidden: Sequence[int]
    activation: str = "relu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return MLP(self.hidden, self.activation, obs_ndim=1)(conv_features(x, self.KIND, self.activation))


class MinAtarCNN(_ConvTorso):
    """Conv(16, 3x3) over a [..., 10, 10, C] grid, then the MLP (the MinAtar baseline network)."""

    KIND: ClassVar[str] = "minatar"


class NatureCNN(_ConvTorso):
    """The Nature DQN torso (Mnih et al. 2015) over [..., H, W, C] frames of 0..255: Conv(32, 8x8, stride 4),
    Conv(64, 4x4, stride 2), Conv(64, 3x3, stride 1), then the MLP (Nature: one layer of 512)."""

    KIND: ClassVar[str] = "nature"


CNN_TORSOS = {"minatar": MinAtarCNN, "nature": NatureCNN}


def cnn_kind(obs_shape: tuple[int, ...], kind: str = "auto") -> str | None:
    """The CNN `make_torso` builds for these observations ('minatar', 'nature'), or None (an MLP): "auto" picks
    the Nature CNN for images of at least `NATURE_MIN_SIZE` pixels a side (Atari's 84x84), the MinAtar one for
    smaller grids, and an MLP for anything that is not [H, W, C]."""
    if kind != "auto" or len(obs_shape) != 3:
        return None
    return "nature" if min(obs_shape[:2]) >= NATURE_MIN_SIZE else "minatar"


def make_torso(obs_shape: tuple[int, ...], hidden: Sequence[int], activation: str, kind: str = "auto",
               name: str | None = None) -> nn.Module:
    """kind "auto": a CNN for image-like [H, W, C] observations (`cnn_kind`), else an MLP; "mlp": an MLP over
    the flattened observation whatever its shape. name: the parameters' (None: flax numbers it)."""
    cnn = cnn_kind(obs_shape, kind)
    if cnn is not None:
        return CNN_TORSOS[cnn](tuple(hidden), activation, name=name)
    return MLP(tuple(hidden), activation, obs_ndim=len(obs_shape), name=name)


def network_torso(obs_shape: tuple[int, ...], hidden: Sequence[int], activation: str, kind: str,
                  network: str | None, index: int) -> nn.Module:
    """The torso of network `index` (0: the actor, or the only network; 1: the critic): the user's own
    (`network`, see `nets.torso`) or `make_torso`'s, named by its index as flax numbers two built-in torsos
    ('MLP_0', 'MLP_1'; a user's 'Torso_0', 'Torso_1'), so the sparse groups and the actor branch find
    each network's layers whichever of them is the user's."""
    if network is not None:
        return UserTorso(network, tuple(obs_shape), name=TORSO_NAMES[index])
    cnn = cnn_kind(obs_shape, kind)
    builtin = CNN_TORSOS[cnn] if cnn is not None else MLP
    return make_torso(obs_shape, hidden, activation, kind, name=f"{builtin.__name__}_{index}")


def as_images(torso: nn.Module, x: jax.Array, obs_shape: tuple[int, ...]) -> jax.Array:
    """A CNN torso's input as images [..., *obs_shape]: flattened observations [..., d] (how host actors' chain
    checks and `base.forward` pass them) are reshaped back; images and MLP inputs pass unchanged."""
    if isinstance(torso, MLP) or tuple(x.shape[-len(obs_shape):]) == tuple(obs_shape):
        return x
    return x.reshape(x.shape[:-1] + tuple(obs_shape))


class Features(NamedTuple):
    """The convolution part of a network whose layers after it are a Dense chain (host actors run this part
    in fp32, the chain in their precision): `apply(params, obs [B, *obs_shape]) -> [B, F]` on `params`, the
    convolution variables `select(network variables)` picks out (all a copy must carry for it)."""

    apply: Callable[[Any, jax.Array], jax.Array]
    select: Callable[[Any], Any]


def torso_features(obs_shape: tuple[int, ...], activation: str, kind: str = "auto",
                   path: tuple[str, ...] = ()) -> Features | None:
    """`Features` of the torso `make_torso` builds, found at `path` in the network's 'params' (e.g.
    ('NatureCNN_0',)); None for an MLP torso (the whole network is then a Dense chain)."""
    cnn = cnn_kind(obs_shape, kind)
    if cnn is None:
        return None
    module = ConvFeatures(cnn, activation)
    path = path or (CNN_TORSOS[cnn].__name__ + "_0",)

    def select(variables: Any) -> Any:
        node = variables["params"]
        for name in path:
            node = node[name]
        return {"params": {name: layer for name, layer in node.items() if name.startswith("Conv_")}}

    return Features(apply=module.apply, select=select)


class ActorCritic(nn.Module):
    """Separate actor and critic torsos (PureJaxRL PPO layout).

    Returns (distribution, value [...]). Discrete: categorical over `action_dim` logits (head gain 0.01).
    Continuous: diagonal Gaussian with state-independent log-std initialised to 0.
    """

    action_dim: int
    discrete: bool
    obs_shape: tuple[int, ...]
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: str = "auto"  # make_torso's kind
    actor_network: str | None = None  # the user's own actor torso, MODULE:ATTR (`nets.torso`); None: make_torso's
    critic_network: str | None = None  # the critic's, alike

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[Categorical | DiagGaussian, jax.Array]:
        actor = network_torso(self.obs_shape, self.hidden, self.activation, self.torso, self.actor_network, 0)(obs)
        out = dense(self.action_dim, gain=0.01)(actor)
        if self.discrete:
            dist = categorical(out)
        else:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            dist = diag_gaussian(out, jnp.exp(log_std) * jnp.ones_like(out))
        critic = network_torso(self.obs_shape, self.hidden, self.activation, self.torso, self.critic_network, 1)(obs)
        value = dense(1, gain=1.0)(critic)[..., 0]
        return dist, value


class ActorBranch(nn.Module):
    """The actor half of an `ActorCritic` on flat observations [B, d] -> logits or Gaussian mean [B, A], with
    the same parameter names (its torso 'MLP_0', 'MinAtarCNN_0' or 'NatureCNN_0', its head 'Dense_0'), so it runs on a
    subtree of the ActorCritic's parameters (`actor_branch_params`). With an MLP torso it is the plain Dense
    chain host actors run in any precision (`sparqrl.quant`)."""

    action_dim: int
    obs_shape: tuple[int, ...]
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: str = "auto"  # make_torso's kind
    network: str | None = None  # the user's own torso (`ActorCritic.actor_network`)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        torso = network_torso(self.obs_shape, self.hidden, self.activation, self.torso, self.network, 0)
        return dense(self.action_dim, gain=0.01)(torso(as_images(torso, x, self.obs_shape)))


def actor_branch_params(variables: Any) -> Any:
    """The `ActorBranch` variables inside an `ActorCritic`'s: its first torso and its first Dense head."""
    params = variables["params"]
    torsos = ("MLP_0", TORSO_NAMES[0]) + tuple(cls.__name__ + "_0" for cls in CNN_TORSOS.values())
    return {"params": {k: params[k] for k in torsos + ("Dense_0",) if k in params}}


class QNetwork(nn.Module):
    """Action values [..., n_actions] from an MLP or CNN torso."""

    action_dim: int
    obs_shape: tuple[int, ...]
    hidden: Sequence[int] = (120, 84)
    activation: str = "relu"
    network: str | None = None  # the user's own torso, MODULE:ATTR (`nets.torso`); None: make_torso's

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        torso = network_torso(self.obs_shape, self.hidden, self.activation, "auto", self.network, 0)
        return nn.Dense(self.action_dim)(torso(as_images(torso, obs, self.obs_shape)))
