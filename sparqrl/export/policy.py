"""A trained deterministic policy as plain NumPy arrays: what an exported graph computes, framework-free.

    describe(algo, config, obs_shape, action_space, policy_params) -> Policy    one seed's policy params
    load_policy(run_dir, seed) -> (Policy, reference, info)                     any saved run

`Policy` is the whole deterministic action of a run, in the order the library computes it:

    obs [B, *obs_shape] -> (x - mean) / std, clipped         PPO with normalize_obs (its running statistics)
        -> Conv 3x3 'SAME' -> activation, flattened (H, W, C)  PPO / DQN on [H, W, C] grids (MinAtar)
        -> Dense -> activation -> ... -> Dense                the policy network's chain (raw [B, out]); a
                                                              recurrent policy's cell (`Cell`) before its last
                                                              layer, its state an input and an output
        -> head                                               argmax (discrete); for boxes: the first
                                                              `take` outputs (SAC's mean), tanh, then
                                                              center + half_range * a (TD3, SAC) or
                                                              clip to [low, high] (PPO's Gaussian mean)

The layer names are the flax modules' own (`sparqrl.nets`: ActorCritic, QNetwork, HeadMLP). An
exporter does not trust them blindly: `sparqrl.export` runs the exported fp32 graph against the
library's own `act` before writing anything.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, NamedTuple, NoReturn

import numpy as np

from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.quant import DenseStack


class ObsNorm(NamedTuple):
    """clip((obs - mean) / std, -clip, clip) elementwise (`sparqrl.envs.normalize`)."""

    mean: np.ndarray  # float32 [*obs_shape]
    std: np.ndarray  # float32 [*obs_shape], sqrt(var + 1e-8) as the library computes it
    clip: float


class ConvLayer(NamedTuple):
    """flax `nn.Conv` (stride 1, 'SAME' padding) on [B, H, W, C], then the activation."""

    kernel: np.ndarray  # float32 [kh, kw, c_in, c_out] (flax's HWIO)
    bias: np.ndarray  # float32 [c_out]
    activation: str


class Head(NamedTuple):
    """How the raw network output [B, out] becomes the env's action."""

    discrete: bool  # argmax -> int32 [B]; else float32 [B, take]
    take: int = 0  # boxes: the first `take` raw outputs (SAC's [mean, log-std] -> mean)
    tanh: bool = False  # squash into [-1, 1] first
    center: np.ndarray | None = None  # float32 [take]: action = center + half_range * a
    half_range: np.ndarray | None = None
    low: np.ndarray | None = None  # float32 [take]: action = min(max(a, low), high)
    high: np.ndarray | None = None


GATES = {"lstm": "ifgo", "gru": "rzn"}
"""A cell's gates in the order `Cell` concatenates their weights (flax's OptimizedLSTMCell / GRUCell names them
'i{gate}' for the input's kernel and 'h{gate}' for the state's)."""
STATE = {"lstm": ("c", "h"), "gru": ("h",)}
"""A cell's state, in the order of flax's carry: the LSTM's (c, h), the GRU's h, each [B, size]."""


class Cell(NamedTuple):
    """A recurrent policy's cell (`nets.memory.RecurrentActorCritic`'s 'Memory_0') between the torso's last
    activation x and the head, each gate's weights concatenated along the output axis in `GATES` order:

        LSTM: [i f g o] = x W_x + h W_h + b_h;  c' = σ(f) c + σ(i) tanh(g);  h' = σ(o) tanh(c')
        GRU:  [r z n]_x = x W_x + b_x, [r z n]_h = h W_h + b_h;  r = σ(r_x + r_h), z = σ(z_x + z_h),
              n = tanh(n_x + r n_h);  h' = (1 - z) n + z h
    The head takes h'."""

    kind: str  # 'lstm' | 'gru'
    size: int
    x_kernel: np.ndarray  # float32 [in, gates * size]
    x_bias: np.ndarray  # float32 [gates * size]
    h_kernel: np.ndarray  # float32 [size, gates * size]
    h_bias: np.ndarray  # float32 [gates * size]


class Policy(NamedTuple):
    """One seed's deterministic policy (see the module docstring)."""

    obs_shape: tuple[int, ...]
    obs_norm: ObsNorm | None
    conv: ConvLayer | None
    stack: DenseStack
    head: Head
    cell: Cell | None = None  # a recurrent policy's, before the stack's last layer; None: feed-forward


class RunInfo(NamedTuple):
    """What an export reports about the run it came from."""

    algo: str
    env: str
    seeds: int  # policies in the run (a sweep's: settings x seeds)
    sparse: str  # the run's sparse method ('dense' for algorithms without one)


Reference = Callable[[np.ndarray], np.ndarray]
"""The library's own deterministic action on a batch of observations [B, *obs_shape]; for a recurrent policy
(obs [B, *obs_shape], state) -> (action, next state), the state as flax's carry (`STATE`)."""


# ---- reading flax parameter trees ----------------------------------------------------------------


def unexportable(what: str, why: str) -> NoReturn:
    """A policy the exporter cannot write correctly: one line, as every ConfigError."""
    raise cfg.ConfigError(f"sparqrl export: the {what} cannot be exported: {why}")


def _node(tree: Any, path: tuple[str, ...], what: str) -> Any:
    node = tree
    for name in path:
        if not hasattr(node, "keys") or name not in node:
            unexportable(what, f"its parameters have no {'/'.join(path)} (a network the exporter does not know)")
        node = node[name]
    return node


def _numbered(tree: Any, prefix: str) -> list[str]:
    """The keys `prefix_0, prefix_1, ...` of a flax module's parameters, in number order."""
    found = [(int(m.group(1)), k) for k in tree.keys() if (m := re.fullmatch(rf"{prefix}_(\d+)", k))]
    return [k for _, k in sorted(found)]


def _dense(layer: Any) -> tuple[np.ndarray, np.ndarray]:
    kernel = np.asarray(layer["kernel"], np.float32)
    bias = np.asarray(layer["bias"], np.float32) if "bias" in layer else np.zeros(kernel.shape[-1], np.float32)
    return kernel, bias


def _torso(params: Any, conv: bool, activation: str, what: str) -> tuple[ConvLayer | None, list, list]:
    """`make_torso`'s layers (the first torso of the module: the actor's in ActorCritic) as
    (conv layer or None, hidden kernels, hidden biases)."""
    conv_layer = None
    if conv:
        cnn = _node(params, ("MinAtarCNN_0",), what)
        kernel, bias = _dense(_node(cnn, ("Conv_0",), what))
        if kernel.ndim != 4:
            unexportable(what, f"its Conv kernel has shape {kernel.shape}, not [kh, kw, in, out]")
        conv_layer = ConvLayer(kernel, bias, activation)
        mlp = _node(cnn, ("MLP_0",), what)
    else:
        mlp = _node(params, ("MLP_0",), what)
    layers = [_dense(mlp[name]) for name in _numbered(mlp, "Dense")]
    return conv_layer, [k for k, _ in layers], [b for _, b in layers]


def _torso_and_head(root: Any, conv: bool, activation: str, what: str) -> tuple[ConvLayer | None, DenseStack]:
    """`_torso`, then the head Dense_0 (a QNetwork's Q head; ActorCritic's actor head, Dense_1 being its value)."""
    conv_layer, kernels, biases = _torso(root, conv, activation, what)
    head_kernel, head_bias = _dense(_node(root, ("Dense_0",), what))
    return conv_layer, DenseStack(tuple(kernels) + (head_kernel,), tuple(biases) + (head_bias,), activation)


def _box_bounds(action_space: Any) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(action_space.low, np.float32), np.asarray(action_space.high, np.float32)


def describe(algo: str, config: Any, obs_shape: tuple[int, ...], action_space: Any, policy_params: Any) -> Policy:
    """The `Policy` of one seed from its policy params (`Algorithm.policy(state)` on device, or
    `ActorLearner.policy(learner)` on the host: the same trees), for the algorithm's config and env.

    `algo` must be registered (`sparqrl.algos.ALGORITHMS`); the network is recognised by its parameters, not
    by a list of names, so a registered algorithm with one of the library's three policy networks exports
    unchanged: ActorCritic with observation statistics (`algos.actor_critic.PolicyParams`: PPO, IMPALA), a
    HeadMLP actor (TD3, SAC) or a QNetwork (DQN)."""
    get_algorithm(algo)  # an unregistered name: one-line ConfigError listing the registered ones
    obs_shape = tuple(int(d) for d in obs_shape)
    what = f"{algo} policy"
    torsos = config.network_references() if config is not None else ()
    own = ", ".join(f"{field}={spec}" for field, spec in torsos)
    if own:  # (its parameters would otherwise be read as a built-in layout's)
        unexportable(what, f"it runs your own torso ({own}), which the exporter cannot write; it writes the "
                           "built-in MLP and MinAtar policies")
    if hasattr(policy_params, "obs_stats"):
        return _actor_critic_policy(config, obs_shape, action_space, policy_params, what)
    root = _node(policy_params, ("params",), what)
    if "HeadMLP_0" in root:  # the actor: HeadMLP_0 = Dense chain, then tanh (SAC: of the mean half)
        head_mlp = root["HeadMLP_0"]
        layers = [_dense(head_mlp[name]) for name in _numbered(head_mlp, "Dense")]
        stack = DenseStack(tuple(k for k, _ in layers), tuple(b for _, b in layers), config.activation)
        low, high = _box_bounds(action_space)
        take = low.shape[0]
        center, half_range = (high + low) / 2.0, (high - low) / 2.0  # as `offpolicy.loop.to_env`
        return Policy(obs_shape, None, None, stack, Head(False, take, True, center, half_range))
    conv_layer, stack = _torso_and_head(root, len(obs_shape) == 3, config.activation, what)  # a QNetwork
    return Policy(obs_shape, None, conv_layer, stack, Head(True))


def _actor_critic_policy(config: Any, obs_shape: tuple[int, ...], action_space: Any, policy_params: Any,
                         what: str) -> Policy:
    """`describe` for an ActorCritic (`algos.actor_critic.PolicyParams`: network params, observation statistics)."""
    params, obs_stats = policy_params.params, policy_params.obs_stats
    from sparqrl.nets import cnn_kind  # (flax: only when a policy is described)

    kind = cnn_kind(obs_shape, config.torso)  # `nets.make_torso`'s
    if kind == "nature":
        unexportable(what, "it runs the Nature CNN (three strided convolutions), which the exporter does not "
                     "write yet; it writes MLP and MinAtar (one convolution) policies")
    root = _node(params, ("params",), what)
    conv_layer, stack = _torso_and_head(root, kind is not None, config.activation, what)
    memory = getattr(config, "memory", "none")
    cell = None if memory == "none" else _cell(_node(root, ("Memory_0",), what), memory, what)
    norm = None
    if obs_stats is not None:
        var = np.asarray(obs_stats.var, np.float32)
        norm = ObsNorm(np.asarray(obs_stats.mean, np.float32), np.sqrt(var + np.float32(1e-8)), 10.0)
    if hasattr(action_space, "n"):
        head = Head(True)
    else:
        low, high = _box_bounds(action_space)
        head = Head(False, low.shape[0], low=low, high=high)
    return Policy(obs_shape, norm, conv_layer, stack, head, cell)


def _cell(node: Any, kind: str, what: str) -> Cell:
    """The `Cell` of flax's cell parameters `node` (gates 'i{gate}' on the input, 'h{gate}' on the state)."""
    x = [_dense(_node(node, (f"i{gate}",), what)) for gate in GATES[kind]]
    h = [_dense(_node(node, (f"h{gate}",), what)) for gate in GATES[kind]]
    join = lambda layers, at: np.concatenate([layer[at] for layer in layers], axis=-1)  # noqa: E731
    return Cell(kind, int(h[0][0].shape[0]), join(x, 0), join(x, 1), join(h, 0), join(h, 1))


# ---- runs on disk ---------------------------------------------------------------------------------


def load_policy(run_dir: str | Path, seed: int, trust_imports: Any = False) -> tuple[Policy, Reference, RunInfo]:
    """Seed `seed`'s policy of the run in `run_dir` (its newest intact checkpoint), the library's own
    deterministic action for it (`sparqrl.load(run_dir).act`), and facts about the run. A bad `seed` is a
    ConfigError. trust_imports: as `sparqrl.load`'s."""
    from sparqrl.api import load

    agent = load(run_dir, trust_imports=trust_imports)
    one = agent.policy_params(seed)
    policy = describe(agent.algo, agent.config, agent.obs_shape, agent.action_space, one)
    info = RunInfo(agent.algo, agent.env, agent.seeds, str(getattr(agent.config, "sparse", "dense")))
    if policy.cell is not None:  # the library's recurrent deterministic act (`algos.base.RecurrentAct`), stepped
        return policy, recurrent_reference(agent.act_function(), one), info  # (agent.act refuses single observations)
    return policy, lambda obs: agent.act(np.asarray(obs, np.float32), seed=seed), info


def recurrent_reference(act: Any, policy_params: Any) -> Reference:
    """(obs [B, *obs_shape], state) -> (action, next state) of a `RecurrentAct` (deterministic: no key is read)."""
    import jax

    step = jax.jit(act.step)

    def reference(obs: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        keys = jax.random.split(jax.random.PRNGKey(0), len(obs))
        action, state = step(policy_params, np.asarray(obs, np.float32), keys, state)
        return np.asarray(action), jax.tree.map(np.asarray, state)

    return reference
