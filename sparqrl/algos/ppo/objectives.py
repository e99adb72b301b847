"""Pluggable PPO objectives: drift functions (PPO-clip, DPO, learned LPO) and value losses (L2,
learned), as small pure functions of the probability ratio and the advantage.

Mirror-learning view (Kuba, Schroeder de Witt and Foerster 2022, arXiv 2201.02373; used by LPO/DPO,
Lu et al. 2022, arXiv 2210.05639): a policy objective is

    maximise  E[ r·Â − f(r, Â) ],     i.e.  loss = −mean(r·Â − f(r, Â))     (`losses.policy_loss`)

with r = π_θ(a|s) / π_old(a|s) = exp(log π_θ − log π_old) and Â the advantage (normalised over the
minibatch by the caller, reference `purejaxrl_dpo_evosax.md` §4.1). The drift f ≥ 0 penalises moving
away from the old policy; PPO-clip, DPO and a learned network are three drifts.

Every function here sees only r and Â (per sample, any batch shape), never the action or the
distribution, so it works unchanged for discrete (categorical) and continuous (Gaussian) policies:
the policy only enters through log π_θ(a|s).

Meta-parameters (LPO drift network, learned value loss) are plain pytrees of float32 arrays, so an
evolution strategy can ravel them into one flat vector (`jax.flatten_util.ravel_pytree`), and a
vmapped population of them is just a leading axis on every leaf. Both start at the hand-written rule
they replace: a network whose output layer is zero is PPO-clip's drift (LPO) or L2 (value loss), and
the starts (`lpo_init`, `value_loss_init`) are such networks with random hidden layers.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.config import ConfigError, close_matches, fail
from sparqrl.npzsafe import Header, read_npz

DPO_ALPHA = 2.0
"""DPO's α for positive advantages (reference §4.1)."""
DPO_BETA = 0.6
"""DPO's β for negative advantages (reference §4.1)."""

LPO_HIDDEN = 128
"""Width of the LPO drift network (reference §5.2: Dense(128, no bias) → tanh → Dense(1, no bias))."""
LPO_NUM_FEATURES = 8
"""δ = [log r, (log r)², 1 − r, (1 − r)²] and Â·δ (reference §5.2)."""
LPO_DEAD_ZONE = 1e-4
"""The 1e-4 of the reference's output transform (§5.2); see `lpo_drift` for where it is applied."""

VALUE_LOSS_HIDDEN = 64
"""Width of both hidden layers of the learned value loss (reference §6: 64 → tanh → 64 → tanh → 1)."""

START_SEED = 0
"""The learned rules' fixed starts draw their hidden layers from PRNGKey(START_SEED) (`lpo_init`, `value_loss_init`)."""

META_PARAMS_FILE = "best_meta_params.npz"
"""File name a meta run writes its best meta-parameters to; `load_meta_params(DIR, ...)` reads it."""


# --------------------------------------------------------------------------------------------------
# Drifts (the surrogate loss they enter is `losses.policy_loss`)
# --------------------------------------------------------------------------------------------------


def ppo_clip_drift(r: jax.Array, advantages: jax.Array, eps: float | jax.Array) -> jax.Array:
    """PPO-clip written as a drift (LPO's "PPO start", reference §5.2):

        f(r, Â) = ReLU( (r − clip(r, 1 − ε, 1 + ε)) · Â )

    so that r·Â − f(r, Â) = min(r·Â, clip(r, 1 − ε, 1 + ε)·Â), PPO's clipped surrogate (Schulman et al.
    2017, eq. 7): `losses.policy_loss` with this drift is exactly PPO's actor loss, in value and gradient.

    Args:
      r, advantages: same shape (any); eps: the clip range ε (may be traced).
    Returns:
      drift, same shape as r, ≥ 0.
    """
    return jax.nn.relu((r - jnp.clip(r, 1.0 - eps, 1.0 + eps)) * advantages)


def dpo_drift(
    r: jax.Array,
    advantages: jax.Array,
    alpha: float | jax.Array = DPO_ALPHA,
    beta: float | jax.Array = DPO_BETA,
) -> jax.Array:
    """Discovered Policy Optimisation drift (Lu et al. 2022, arXiv 2210.05639; reference §4.1):

        f(r, Â) = ReLU( (r − 1)·Â − α·tanh((r − 1)·Â / α) )    if Â ≥ 0
        f(r, Â) = ReLU( log(r)·Â − β·tanh(log(r)·Â / β) )      if Â < 0

    with α = 2, β = 0.6 by default. DPO uses no ratio clipping: the actor loss is
    `losses.policy_loss(..., drift=lambda r, a: dpo_drift(r, a, alpha, beta))`.

    Args:
      r: probability ratios (> 0); advantages: same shape; alpha, beta: scalars (may be traced).
    Returns:
      drift, same shape as r, ≥ 0.
    """
    positive = (r - 1.0) * advantages
    negative = jnp.log(r) * advantages
    drift_pos = jax.nn.relu(positive - alpha * jnp.tanh(positive / alpha))
    drift_neg = jax.nn.relu(negative - beta * jnp.tanh(negative / beta))
    return jnp.where(advantages >= 0, drift_pos, drift_neg)


# --------------------------------------------------------------------------------------------------
# LPO: a learned drift network (reference §5.2)
# --------------------------------------------------------------------------------------------------


class LPOParams(NamedTuple):
    """Meta-parameters of the LPO drift network: Dense(H, no bias) → tanh → Dense(1, no bias)
    (reference §5.2; H = 128 gives 8·128 + 128 = 1,152 numbers)."""

    hidden: jax.Array  # [8, H]
    out: jax.Array  # [H]


def _start_layer(index: int, shape: tuple[int, ...]) -> jax.Array:
    """A hidden layer of a learned rule's fixed start: LeCun normal (std 1/sqrt(fan_in)), from START_SEED."""
    key = jax.random.fold_in(jax.random.PRNGKey(START_SEED), index)
    return jax.random.normal(key, shape, jnp.float32) / np.sqrt(shape[0])


def lpo_init(key: jax.Array | None = None, hidden: int = LPO_HIDDEN) -> LPOParams:
    """The PPO-clip start of LPO: a random hidden layer and a zero output layer, for which the network is
    0 everywhere and `lpo_drift` is `ppo_clip_drift` exactly (value and gradient).

    Not all zero: at zero weights the two layers' product is a saddle, where a perturbation and its
    mirror (antithetic sampling) give the same network, and the network's change (second order in the
    search's sigma) stays inside the 1e-4 dead zone, so an evolution strategy would get no signal at all.
    With only the output layer at zero, a perturbation changes the drift to first order.

    `key` is accepted for the meta-task protocol `init(key) -> genome` and not used: the start is fixed
    (START_SEED); the evolution strategy supplies the randomness.
    """
    del key
    return LPOParams(hidden=_start_layer(0, (LPO_NUM_FEATURES, hidden)), out=jnp.zeros((hidden,), jnp.float32))


def lpo_features(r: jax.Array, advantages: jax.Array) -> jax.Array:
    """LPO's drift inputs (reference §5.2): δ = [log r, (log r)², 1 − r, (1 − r)²], input = [δ, Â·δ].

    Args:
      r, advantages: same shape S.
    Returns:
      [*S, 8]. Every feature is 0 at r = 1, so the bias-free network outputs 0 there for any weights.
    """
    log_r = jnp.log(r)
    one_minus_r = 1.0 - r
    delta = jnp.stack([log_r, jnp.square(log_r), one_minus_r, jnp.square(one_minus_r)], axis=-1)
    return jnp.concatenate([delta, advantages[..., None] * delta], axis=-1)


def lpo_network(meta_params: LPOParams, r: jax.Array, advantages: jax.Array) -> jax.Array:
    """The raw network output net(features(r, Â)), same shape as r (reference §5.2)."""
    hidden = jnp.tanh(lpo_features(r, advantages) @ meta_params.hidden)
    return hidden @ meta_params.out


def lpo_drift(
    meta_params: LPOParams,
    r: jax.Array,
    advantages: jax.Array,
    eps: float | jax.Array,
) -> jax.Array:
    """Learned drift with the PPO-clip start (LPO, Lu et al. 2022; reference §5.2 `--ppo-init`):

        f(r, Â) = ReLU( ppo_clip_drift(r, Â, ε) + s(net(r, Â)) ),   s(y) = y − clip(y, −c, c),  c = 1e-4

    The reference writes ReLU(ppo_clip_drift + net − 1e-4), which at zero weights is
    ReLU(ppo_clip_drift − 1e-4): PPO-clip's drift shifted down by 1e-4 and zero where it is below
    1e-4, so it would not "start at PPO's clipping drift" as the reference (and its test, meta_mfos_act.md
    §8.2) says. Here the 1e-4 dead zone acts on the network's output only (soft threshold s): the
    zero network gives exactly `ppo_clip_drift` (value and gradient), and, as in the reference, a
    learned network contributes nothing while |net| < 1e-4, so near r = 1 (where every input is ~0 and
    PPO's drift is 0) the drift and its gradient are exactly 0, as mirror learning requires.

    Args:
      meta_params: `LPOParams` (a population: vmap over its leading axis).
      r, advantages: same shape (any); eps: PPO's clip range ε (may be traced).
    Returns:
      drift, same shape as r, ≥ 0.
    """
    net = lpo_network(meta_params, r, advantages)
    learned = net - jnp.clip(net, -LPO_DEAD_ZONE, LPO_DEAD_ZONE)
    return jax.nn.relu(ppo_clip_drift(r, advantages, eps) + learned)


# --------------------------------------------------------------------------------------------------
# The learned value loss (reference §6; L2 and clipped are `losses.value_loss`)
# --------------------------------------------------------------------------------------------------


class ValueLossParams(NamedTuple):
    """Meta-parameters of the learned value loss: Dense 64 → tanh → Dense 64 → tanh → Dense 1, with
    biases (reference §6: 4,353 numbers)."""

    w1: jax.Array  # [1, H]
    b1: jax.Array  # [H]
    w2: jax.Array  # [H, H]
    b2: jax.Array  # [H]
    w3: jax.Array  # [H, 1]
    b3: jax.Array  # [1]


def value_loss_init(key: jax.Array | None = None, hidden: int = VALUE_LOSS_HIDDEN) -> ValueLossParams:
    """The L2 start of the learned value loss: random hidden layers (zero biases) and a zero output layer,
    for which net(d) = 0 and `learned_value_loss` is L2 (`losses.value_loss` unclipped) exactly. Not all zero, for the
    reason `lpo_init` gives: the network's change would be third order in the search's sigma. `key` is
    unused (protocol `init(key) -> genome`; the start is fixed, START_SEED)."""
    del key
    zeros = lambda *shape: jnp.zeros(shape, jnp.float32)  # noqa: E731
    return ValueLossParams(w1=_start_layer(1, (1, hidden)), b1=zeros(hidden), w2=_start_layer(2, (hidden, hidden)),
                           b2=zeros(hidden), w3=zeros(hidden, 1), b3=zeros(1))


def value_loss_network(meta_params: ValueLossParams, d: jax.Array) -> jax.Array:
    """The raw network net(d) applied to every element of d = prediction − target (reference §6)."""
    x = d[..., None]
    x = jnp.tanh(x @ meta_params.w1 + meta_params.b1)
    x = jnp.tanh(x @ meta_params.w2 + meta_params.b2)
    return (x @ meta_params.w3 + meta_params.b3)[..., 0]


def learned_value_loss(meta_params: ValueLossParams, pred: jax.Array, target: jax.Array) -> jax.Array:
    """Learned value loss (PureJaxRL walkthrough, reference §6), started at L2:

        L = mean( 0.5·d² + net(d) ),   d = v − t

    The reference's loss is mean(net(d)) from a random start; adding 0.5·d² makes a network with a
    zero output layer (`value_loss_init`) exactly L2 in value and gradient, so evolution starts from the loss
    PPO uses and the network learns a correction. It replaces the clipped loss (no v_old).

    Args:
      meta_params: `ValueLossParams`; pred, target: [N].
    Returns:
      scalar loss.
    """
    d = pred - target
    return jnp.mean(0.5 * jnp.square(d) + value_loss_network(meta_params, d))


# --------------------------------------------------------------------------------------------------
# Meta-parameter files
# --------------------------------------------------------------------------------------------------


def _leaf_names(tree: Any) -> list[str]:
    """One stable name per leaf: its path in the pytree ('hidden', 'out', "['a'][0]", ...)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path, simple=True, separator="/") or "value" for path, _ in flat]


def save_meta_params(path: str | os.PathLike[str], meta_params: Any) -> str:
    """Write a meta-parameter pytree to `path` (.npz, one array per leaf, named by its tree path).

    `path` may be a folder, in which case the file is `path/best_meta_params.npz`. Returns the file.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, META_PARAMS_FILE)
    arrays = {name: np.asarray(leaf) for name, leaf in zip(_leaf_names(meta_params), jax.tree.leaves(meta_params))}
    with open(path, "wb") as f:  # a file object, so numpy does not append a second ".npz"
        np.savez(f, **arrays)
    return path


def load_meta_params(path: str | os.PathLike[str], like: Any) -> Any:
    """Read meta-parameters written by `save_meta_params` into the structure of `like`.

    Args:
      path: the .npz file, or a meta run's folder holding `best_meta_params.npz`.
      like: a pytree with the expected structure and shapes (e.g. `lpo_init()`).
    Returns:
      a pytree like `like`, NumPy float32 leaves: host values, so that a rule read while the runner
      traces its program (`make_algorithm` inside shard_map) is a constant of it, never a tracer
      (`params_digest` hashes it).
    Raises:
      ConfigError (one line) if the file is missing or unreadable, or an array is missing or of
      another shape than expected (naming the file, the array, and the expected and found shapes).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, META_PARAMS_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"meta-parameter file {path} not found")
    names = _leaf_names(like)
    leaves, treedef = jax.tree.flatten(like)
    expected_shapes = {name: tuple(np.shape(leaf)) for name, leaf in zip(names, leaves)}

    def check(headers: dict[str, Header]) -> None:  # from the headers: no array is read before this
        found_shapes = {name: header.shape for name, header in headers.items()}
        if found_shapes != expected_shapes:
            raise ConfigError(f"meta-parameter file {path} has the wrong shape: expected "
                              f"{_describe(expected_shapes)}, found {_describe(found_shapes)}")
        for name, header in headers.items():
            if header.dtype.kind not in "fiu":
                raise ConfigError(f"meta-parameter file {path} holds {name} as {header.dtype}, not numbers")

    try:
        found = read_npz(path, check)
    except ConfigError:
        raise
    except (OSError, ValueError) as error:
        raise ConfigError(f"meta-parameter file {path} is not a readable .npz file ({error})") from None
    return jax.tree.unflatten(treedef, [np.asarray(found[name], np.float32) for name in names])


def _describe(shapes: dict[str, tuple[int, ...]]) -> str:
    return "{" + ", ".join(f"{name}: {shape}" for name, shape in shapes.items()) + "}"


# --------------------------------------------------------------------------------------------------
# The rules a PPO config names ('lpo:PATH', 'learned:PATH') and the meta-parameters they use
# --------------------------------------------------------------------------------------------------


class MetaParams(NamedTuple):
    """Meta-parameters a PPO run uses as inputs (`ppo.make_algorithm(config, env, meta_params)`): the LPO
    drift network for objective 'lpo', the learned value loss for value_loss 'learned'; None where the
    config's rule needs none. A population of them (a leading [P] axis on every leaf) vmaps."""

    lpo: LPOParams | None = None
    value_loss: ValueLossParams | None = None


# field -> (rules without meta-parameters, the learned rule's prefix, an example of its meta-parameters)
_RULES: dict[str, tuple[tuple[str, ...], str, Callable[[], Any]]] = {
    "objective": (("ppo-clip", "dpo"), "lpo", lpo_init),
    "value_loss": (("l2", "clipped"), "learned", value_loss_init),
}
_DIGEST = "#sha256="


def rule_kind(value: str) -> str:
    """'ppo-clip', 'dpo', 'lpo', 'l2', 'clipped' or 'learned': a rule without its 'PATH#sha256=...' part."""
    return value.partition(":")[0]


def _rule_parts(value: str) -> tuple[str, str, str | None]:
    """'lpo:PATH#sha256=HEX' -> ('lpo', 'PATH', 'HEX'); 'lpo:PATH' -> ('lpo', 'PATH', None)."""
    kind, _, rest = value.partition(":")
    path, sep, digest = rest.rpartition(_DIGEST)
    return (kind, path, digest) if sep else (kind, rest, None)


def params_digest(meta_params: Any) -> str:
    """A hash of the meta-parameters' content (leaf names, shapes, float32 bytes): 16 hex digits."""
    digest = hashlib.sha256()
    for name, leaf in zip(_leaf_names(meta_params), jax.tree.leaves(meta_params)):
        array = np.ascontiguousarray(np.asarray(leaf, np.float32))
        digest.update(f"{name}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def _meta_file(path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    return os.path.join(path, META_PARAMS_FILE) if os.path.isdir(path) else path


def load_rule_params(field: str, value: str) -> tuple[str, Any]:
    """Read the meta-parameters of a learned rule ('lpo:PATH' or 'learned:PATH', maybe resolved with
    '#sha256=...'). Returns (the rule resolved: absolute file and the hash of its content, the params).

    Raises a one-line ConfigError naming `field` when PATH is missing, unreadable or holds arrays of
    the wrong shape, or when a recorded hash no longer matches the file (it changed since the run began).
    """
    plain, prefix, like = _RULES[field]
    kind, path, digest = _rule_parts(value)
    if kind != prefix or not path:
        fail(field, value, f"needs a file: {prefix}:PATH (a `sparqrl meta` run's folder or its {META_PARAMS_FILE})")
    file = _meta_file(path)
    try:
        params = load_meta_params(file, like())
    except ConfigError as error:
        raise ConfigError(f"{field}={value!r}: {error}") from None
    found = params_digest(params)
    if digest is not None and digest != found:
        fail(field, value, f"the file changed since this rule was recorded (its content now hashes to {found}); "
             "start a new run to use the new meta-parameters")
    return f"{prefix}:{file}{_DIGEST}{found}", params


def resolve_rule(field: str, value: Any) -> str:
    """Check a PPO config's `objective` or `value_loss` and resolve a learned rule with a file to
    'prefix:/abs/file#sha256=HEX' (its content's hash, so the config's repr, which keys stored compiled
    programs, changes with the weights). A bare 'lpo' / 'learned' (meta-training: the meta-parameters are
    an input of `make_algorithm`) is kept as it is. One-line ConfigError for anything else."""
    plain, prefix, _ = _RULES[field]
    allowed = (*plain, f"{prefix}:PATH")
    if not isinstance(value, str):
        fail(field, value, f"must be one of {', '.join(allowed)}")
    if value in plain or value == prefix:
        return value
    if rule_kind(value) != prefix or ":" not in value:
        fail(field, value, f"must be one of {', '.join(allowed)}{close_matches(value, allowed)}")
    return load_rule_params(field, value)[0]


def meta_params_for(objective: str, value_loss: str, meta_params: Any = None) -> MetaParams:
    """The meta-parameters a PPO config's rules use: those given (a `MetaParams`, or a dict with keys
    'lpo' / 'value_loss'), else read from the rules' files (host side). A learned rule with neither is a
    one-line ConfigError; meta-parameters for a rule the config does not name are an error too."""
    if meta_params is None:
        given = MetaParams()
    elif isinstance(meta_params, MetaParams):
        given = meta_params
    elif isinstance(meta_params, dict) and set(meta_params) <= set(MetaParams._fields):
        given = MetaParams(**meta_params)
    else:
        raise ConfigError(f"meta_params must be a MetaParams or a dict with keys {', '.join(MetaParams._fields)}")
    found = {}
    for field, value, name in (("objective", objective, "lpo"), ("value_loss", value_loss, "value_loss")):
        _, prefix, _ = _RULES[field]
        params = getattr(given, name)
        if rule_kind(value) != prefix:
            if params is not None:
                fail(field, value, f"uses no meta-parameters, but meta_params.{name} was given (use {prefix})")
            found[name] = None
        elif params is not None:
            found[name] = params
        elif value == prefix:
            fail(field, value, f"needs meta-parameters: pass them to make_algorithm, or name a file with {prefix}:PATH")
        else:
            found[name] = load_rule_params(field, value)[1]
    return MetaParams(**found)
