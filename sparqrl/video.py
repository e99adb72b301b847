"""Record episodes of a trained policy as an MP4: `sparqrl eval RUN_DIR --video out.mp4`.

What can be recorded, and how each is drawn:

- `gym:ID` (Gymnasium on the host): the env made with `render_mode="rgb_array"`, stepped with the policy's
  deterministic action; MuJoCo envs render headless (below).
- the gymnax classic-control ids in `GYMNAX_TWINS` (CartPole-v1, Pendulum-v1, MountainCar-v0,
  MountainCarContinuous-v0, Acrobot-v1): the episode runs in the gymnax env the policy was trained in,
  through gymnax's own `step` (the function sparqrl's gymnax adapter calls), and each gymnax state is
  copied into the Gymnasium twin of the same id, which only draws it (pygame). Setting the twin's state is
  more faithful than stepping the twin itself: gymnax and Gymnasium differ in float precision and in their
  random initial states, so a twin-stepped episode would drift from the trained one.
- `brax:NAME`: the episode runs in the run's own Brax env (jitted), and each state's `q, qd` is drawn by
  MuJoCo's renderer (`mujoco.Renderer`) from the env's `mj_model`, from the free camera.

MuJoCo renders headless through EGL (Mesa's software EGL works without a GPU): `MUJOCO_GL=egl` is set unless
the user chose a backend (`MUJOCO_GL=osmesa` needs libosmesa6), and it must be set before MuJoCo is first
imported, so `record` sets it before it loads the run.

Frames: each episode gives its length + 1 frames (the first observation's state, then one per step, the
last one the state the episode ended in), episodes back to back. Frame rate: the env's `render_fps`
(Brax: 1 / dt), so the video plays in real time. The MP4 (H.264, yuv420p) is written by imageio's FFMPEG
plugin with the ffmpeg that the `imageio-ffmpeg` wheel ships, into a temporary file in the same folder
that replaces `out` only when the video is complete.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from sparqrl import config as cfg, quiet
from sparqrl.extras import need
from sparqrl.trust import NOTHING, Trust

WHAT = "sparqrl eval --video"


def _floats(*values: Any) -> np.ndarray:
    return np.array([float(np.squeeze(v)) for v in values], np.float64)


GYMNAX_TWINS: dict[str, Callable[[Any], dict[str, Any]]] = {
    # gymnax EnvState -> the attributes of the Gymnasium twin (same id) that its `render` reads
    "CartPole-v1": lambda s: {"state": _floats(s.x, s.x_dot, s.theta, s.theta_dot)},
    "Pendulum-v1": lambda s: {"state": _floats(s.theta, s.theta_dot), "last_u": float(np.squeeze(s.last_u))},
    "MountainCar-v0": lambda s: {"state": _floats(s.position, s.velocity)},
    "MountainCarContinuous-v0": lambda s: {"state": _floats(s.position, s.velocity)},
    "Acrobot-v1": lambda s: {"state": _floats(s.joint_angle1, s.joint_angle2, s.velocity_1, s.velocity_2)},
}
"""The gymnax ids that can be recorded, with how their state maps onto their Gymnasium twin (same id)."""

RECORDABLE = f"gym:ID (envs that render rgb_array), brax:NAME, and the gymnax ids {', '.join(GYMNAX_TWINS)}"

BRAX_SIZE = (360, 480)
"""(height, width) of Brax frames."""


@dataclasses.dataclass(frozen=True)
class Recording:
    """What `record` wrote."""

    video: str  # the MP4's path
    env: str
    policy_seed: int  # which trained policy of the run acted
    seed: int  # episode e started from seed + e (gym: reset seed; gymnax / Brax: PRNGKey)
    frames: int  # sum over episodes of (length + 1)
    fps: float
    width: int
    height: int
    episode_returns: list[float]
    episode_lengths: list[int]


def check_video_path(path: str | Path, overwrite: bool) -> Path:
    """The MP4 path `path`, checked before anything runs: ends in .mp4, is not a folder, its folder exists,
    and it is a new file unless `overwrite`."""
    out = Path(path)
    cfg.require(not out.is_dir(), "--video", str(path), "is a folder; give the path of an .mp4 file")
    cfg.require(out.suffix.lower() == ".mp4", "--video", str(path), "must be a file name ending in .mp4")
    cfg.require(out.parent.is_dir(), "--video", str(path), f"must be in an existing folder (no folder {out.parent})")
    cfg.require(os.access(out.parent, os.W_OK), "--video", str(path), f"cannot be written (folder {out.parent} is "
                                                                        "not writable)")
    cfg.require(overwrite or not out.exists(), "--video", str(path), "exists already (--overwrite replaces it)")
    return out


def check_recordable(env: str) -> None:
    """A one-line `ConfigError` unless `env` can be recorded (a `gym:` id is checked further when made)."""
    ok = env.startswith(("gym:", "brax:")) or env in GYMNAX_TWINS
    cfg.require(ok, "env", env, f"cannot be recorded: --video records {RECORDABLE}")


def headless_gl() -> None:
    """Make MuJoCo render without a display: EGL, unless the user set MUJOCO_GL. Only takes effect before
    MuJoCo's first import (brax imports it, so call this before loading a brax run)."""
    if "mujoco" not in sys.modules:
        if not os.environ.get("MUJOCO_GL", "").strip():
            os.environ["MUJOCO_GL"] = "egl"
        backend = os.environ["MUJOCO_GL"]
        # MuJoCo raises a bare RuntimeError at import for a value it does not know
        cfg.one_of("MUJOCO_GL", backend.lower().strip(), ("egl", "osmesa", "glfw", "glx", "cgl", "wgl"))
        if backend in ("egl", "osmesa"):  # PyOpenGL, which MuJoCo's EGL/OSMesa contexts use, must agree
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)


def quiet_pygame() -> None:
    """Gymnasium's classic-control renderer draws off-screen, but `pygame.init()` also opens SDL's video and
    audio drivers: without a display or sound card they print errors, and pygame prints a banner on stdout
    (where the CLI writes its JSON). Dummy drivers and no banner, unless the user chose otherwise; only
    before pygame's first import."""
    if "pygame" not in sys.modules:
        for name, value in (("PYGAME_HIDE_SUPPORT_PROMPT", "1"), ("SDL_VIDEODRIVER", "dummy"),
                            ("SDL_AUDIODRIVER", "dummy")):
            os.environ.setdefault(name, value)


def gl_error(error: Exception) -> cfg.ConfigError:
    backend = os.environ.get("MUJOCO_GL", "(unset)")
    return cfg.ConfigError(
        f"MuJoCo could not render headless with MUJOCO_GL={backend} ({type(error).__name__}: {error}); install "
        "EGL (Debian: apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0) or OSMesa "
        "(libosmesa6, then MUJOCO_GL=osmesa)")


# ---- frame sources: generators of uint8 [H, W, 3] frames; each appends (return, length) per episode ----

Act = Callable[[np.ndarray], np.ndarray]
Episodes = list[tuple[float, int]]
Frames = tuple[Iterator[np.ndarray], float]  # the frames (lazily) and their rate in frames per second


def gymnax_frames(env_id: str, act: Act, seed: int, episodes: int, done: Episodes) -> Frames:
    """Episodes in the gymnax env `env_id` (keys PRNGKey(seed + e)), drawn by its Gymnasium twin."""
    import gymnasium as gym
    import gymnax
    import jax

    need("pygame", WHAT)  # Gymnasium's classic-control renderer
    env, params = gymnax.make(env_id)
    twin = gym.make(env_id, render_mode="rgb_array").unwrapped
    to_twin = GYMNAX_TWINS[env_id]

    # The episode advances by gymnax's own `step` (the jitted function sparqrl's gymnax adapter calls), so it
    # is the episode the env gives the policy, to the bit. That step auto-resets: the state an episode ends
    # in, drawn as its last frame, comes from `step_env` (the step without the reset) on the same inputs.
    final_state = jax.jit(lambda key, state, action: env.step_env(jax.random.split(key)[0], state, action, params)[1])

    def draw(state: Any) -> np.ndarray:
        for name, value in to_twin(jax.device_get(state)).items():
            setattr(twin, name, value)
        return twin.render()

    def frames() -> Iterator[np.ndarray]:
        try:
            for e in range(episodes):
                key, reset_key = jax.random.split(jax.random.PRNGKey(seed + e))
                obs, state = env.reset(reset_key, params)
                yield draw(state)
                total, length, over = 0.0, 0, False
                while not over:
                    key, step_key = jax.random.split(key)
                    action = act(np.asarray(obs))
                    obs, next_state, reward, terminated, truncated, _ = env.step(step_key, state, action, params)
                    total, length, over = total + float(reward), length + 1, bool(terminated or truncated)
                    state = final_state(step_key, state, action) if over else next_state
                    yield draw(state)
                done.append((total, length))
        finally:
            twin.close()

    return frames(), float(twin.metadata["render_fps"])


def gym_frames(name: str, act: Act, seed: int, episodes: int, done: Episodes) -> Frames:
    """Episodes of the Gymnasium env `gym:ID` (reset seeds seed + e), its own rgb_array frames. Actions as
    the actor-learner runner sends them (flattened Box reshaped; Discrete 0..n-1 shifted by the space's
    start)."""
    import gymnasium as gym
    from gymnasium import spaces

    from sparqrl.envs import atari, gym_env
    from sparqrl.envs.core import is_atari

    if is_atari(name):  # the preprocessed env the policy saw, drawing the full-colour screen
        env = atari.make_atari(name, training=False, render_mode="rgb_array")
    else:
        env_id = name.removeprefix("gym:")
        cfg.require(env_id in gym.registry, "env", name, "cannot be recorded: --video records registered "
                                                         "Gymnasium ids (not a user's gym:MODULE:ATTR env)")
        limit = None if gym.registry[env_id].max_episode_steps else gym_env.DEFAULT_MAX_EPISODE_STEPS
        quiet.before_gym_make(env_id)
        try:
            env = gym.make(env_id, render_mode="rgb_array", max_episode_steps=limit)
        except gym.error.Error as error:
            raise cfg.ConfigError(f"env={name!r}: Gymnasium could not build it: {error}") from error
        prepare = getattr(gym_env, "_prepare", None)  # the wrappers training used (flattened observations)
        if prepare is not None:
            env = prepare(name, env)
    if "rgb_array" not in env.metadata.get("render_modes", []):
        env.close()
        cfg.fail("env", name, f"cannot be recorded: it does not render rgb_array images; --video records {RECORDABLE}")
    space = env.action_space
    start = int(space.start) if isinstance(space, spaces.Discrete) else 0

    def render() -> np.ndarray:
        try:
            return env.render()
        except gym.error.DependencyNotInstalled as error:
            if "pygame" in str(error):
                need("pygame", WHAT)  # names the extra
            raise cfg.ConfigError(f"env={name!r} cannot render: {error}") from error

    def frames() -> Iterator[np.ndarray]:
        try:
            for e in range(episodes):
                obs, _ = env.reset(seed=seed + e)
                try:
                    first = render()
                except cfg.ConfigError:
                    raise
                except Exception as error:  # MuJoCo's GL context (EGL / OSMesa) could not start
                    raise gl_error(error) from error
                yield first
                total, length, over = 0.0, 0, False
                while not over:
                    action = np.asarray(act(np.asarray(obs, np.float32))).reshape(space.shape).astype(space.dtype)
                    obs, reward, terminated, truncated, _ = env.step(action + start)
                    total, length, over = total + float(reward), length + 1, bool(terminated or truncated)
                    yield render()
                done.append((total, length))
        finally:
            env.close()

    return frames(), float(env.metadata.get("render_fps") or 30)


def brax_frames(name: str, act: Act, seed: int, episodes: int, done: Episodes) -> Frames:
    """Episodes in the run's Brax env (keys PRNGKey(seed + e), `max_episode_steps` as in training), each
    state drawn by `mujoco.Renderer` from its generalized positions and velocities."""
    import jax

    from sparqrl.envs.brax_env import make_brax

    wrapped = make_brax(name.removeprefix("brax:"))
    env = wrapped.env
    mj_model = getattr(getattr(env, "sys", None), "mj_model", None)
    cfg.require(mj_model is not None, "env", name, f"cannot be recorded: it has no MuJoCo model to draw; --video "
                                                   f"records {RECORDABLE}")
    mujoco = need("mujoco", WHAT)
    reset, step = jax.jit(env.reset), jax.jit(env.step)

    def frames() -> Iterator[np.ndarray]:
        try:
            renderer = mujoco.Renderer(mj_model, height=BRAX_SIZE[0], width=BRAX_SIZE[1])
        except Exception as error:  # the GL context (EGL / OSMesa) could not start
            raise gl_error(error) from error
        data = mujoco.MjData(mj_model)

        def draw(state: Any) -> np.ndarray:
            data.qpos[:], data.qvel[:] = np.asarray(state.pipeline_state.q), np.asarray(state.pipeline_state.qd)
            mujoco.mj_forward(mj_model, data)  # body poses from qpos, for the scene
            renderer.update_scene(data, camera=-1)
            return renderer.render()

        try:
            for e in range(episodes):
                state = reset(jax.random.PRNGKey(seed + e))
                yield draw(state)
                total, length, over = 0.0, 0, False
                while not over:
                    state = step(state, act(np.asarray(state.obs)))
                    total, length = total + float(state.reward), length + 1
                    over = float(state.done) > 0.5 or length >= wrapped.max_episode_steps
                    yield draw(state)
                done.append((total, length))
        finally:
            renderer.close()

    return frames(), 1.0 / float(env.dt)


PROGRESS_EVERY_S = 5.0
"""Seconds between `counted`'s lines (a MuJoCo episode of 1,000 frames takes ~95 s to draw and encode)."""


def counted(frames: Iterator[np.ndarray], done: Episodes, episodes: int, say: Callable[[str], None]
            ) -> Iterator[np.ndarray]:
    """`frames`, saying every `PROGRESS_EVERY_S` seconds how far the recording is (`done`: the episodes
    finished so far)."""
    count, last = 0, time.perf_counter()
    for frame in frames:
        yield frame
        count += 1
        if time.perf_counter() - last >= PROGRESS_EVERY_S:
            last = time.perf_counter()
            say(f"recording: episode {min(len(done) + 1, episodes)} of {episodes}, {count:,} frames so far")


# ---- encoding ----

def write_mp4(frames: Iterator[np.ndarray], out: Path, fps: float) -> tuple[int, int, int]:
    """Encode `frames` (uint8 [H, W, 3], one size) as H.264 into `out`; returns (count, height, width).
    Frames stream to ffmpeg as they come (an episode of MuJoCo frames would not fit in memory); a partial
    file is removed on failure, and `out` is replaced only at the end."""
    import imageio.v2 as imageio

    partial = out.with_name(f".{out.stem}.partial-{os.getpid()}.mp4")  # ffmpeg picks the container by suffix
    count, size = 0, None
    try:
        with quiet.exec_forks():  # imageio starts ffmpeg with subprocess
            # macro_block_size=2: yuv420p needs even sides; frames of other sizes are scaled, never cropped
            with imageio.get_writer(partial, format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                    pixelformat="yuv420p", macro_block_size=2, ffmpeg_log_level="error") as writer:
                for frame in frames:
                    frame = np.asarray(frame, np.uint8)
                    size = size or frame.shape[:2]
                    writer.append_data(frame)
                    count += 1
        cfg.require(count > 0, "--video", str(out), "got no frames to write")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return count, size[0] + size[0] % 2, size[1] + size[1] % 2


def record(run_dir: str | Path, video: str | Path, *, episodes: int = 1, policy_seed: int = 0,
           seed: int | None = None, overwrite: bool = False, trust: Trust = NOTHING,
           progress: bool = True) -> Recording:
    """Record `episodes` deterministic episodes of trained policy `policy_seed` of the run in `run_dir` into
    the MP4 `video`. seed: episode e starts from seed + e (default: the run's seed). Every argument, the
    env and the extras are checked before anything runs or is written. `trust`: the modules the command
    names (`sparqrl.trust`). `progress`: a line on stderr when recording starts and every
    `PROGRESS_EVERY_S` seconds of it (`counted`)."""
    from sparqrl.runners.rundir import open_run_dir
    from sparqrl.runners.session import notify

    cfg.require(isinstance(episodes, int) and episodes >= 1, "--episodes", episodes, "must be an integer >= 1")
    out = check_video_path(video, overwrite)
    _, _, _, run = open_run_dir(run_dir, "DIR", trust)
    check_recordable(run.env)
    need("imageio_ffmpeg", WHAT)
    quiet_pygame()  # gym: classic-control and Box2D envs draw with pygame too
    if run.env.startswith(("gym:", "brax:")):
        headless_gl()  # before brax or a Gymnasium MuJoCo env imports MuJoCo
    if run.env.startswith("brax:"):
        need("brax", WHAT)
        need("mujoco", WHAT)
    elif not run.env.startswith("gym:"):
        need("pygame", WHAT)

    import sparqrl

    agent = sparqrl.load(run_dir, trust_imports=trust)  # compiles nothing yet
    cfg.require(isinstance(policy_seed, int) and 0 <= policy_seed < agent.seeds, "--video-seed", policy_seed,
                f"must be an integer in [0, {agent.seeds}) (the run's trained policies; a sweep's: settings x seeds)")
    start = run.seed if seed is None else int(seed)
    act: Act = lambda obs: agent.act(obs, seed=policy_seed)  # noqa: E731
    done: Episodes = []
    source = (gym_frames if run.env.startswith("gym:") else brax_frames if run.env.startswith("brax:")
              else gymnax_frames)
    frames, fps = source(run.env, act, start, episodes, done)
    cfg.require(math.isfinite(fps) and fps > 0, "env", run.env, f"reports a frame rate of {fps}")
    if progress:
        notify(f"recording {episodes} episode{'s' if episodes > 1 else ''} of {run.env} into {out}")
        frames = counted(frames, done, episodes, notify)
    count, height, width = write_mp4(frames, out, fps)
    return Recording(video=str(out), env=run.env, policy_seed=policy_seed, seed=start, frames=count, fps=fps,
                     width=width, height=height, episode_returns=[r for r, _ in done],
                     episode_lengths=[n for _, n in done])
