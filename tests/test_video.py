"""`sparqrl eval RUN_DIR --video out.mp4`: the MP4 holds the episode the policy plays (frame count, size, the
cart where the state puts it), gymnax states map onto their Gymnasium twins, MuJoCo renders headless, and
bad input is a one-line error that writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import gymnax
import imageio.v2 as imageio
import jax
import numpy as np
import pytest

import sparqrl
from sparqrl import video
from sparqrl.cli import main
from sparqrl.config import ConfigError

# Barely trained (its episodes are short, so recording and reading them back is quick)
TINY = dict(steps=512, chunks=1, num_steps=32, energy=False, eval_episodes=2)
CARTPOLE_SIZE = (400, 600)  # Gymnasium's CartPole screen, rows x columns


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    run = sparqrl.train("ppo", "CartPole-v1", seeds=2, out=tmp_path_factory.mktemp("video") / "ppo",
                        lr=1e-3, hidden=(32, 32), **TINY)
    return run.path


def cli(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(["eval", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def read_frames(path) -> np.ndarray:
    """The decoded frames [count, H, W, 3] (short videos only: they are all held in memory)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)  # fork + exec of ffmpeg
        with imageio.get_reader(path, format="FFMPEG") as reader:
            return np.stack([frame for frame in reader])  # not list(reader): its len() is inf


def gymnax_episodes(run_dir, env_id: str, policy_seed: int, seed: int, episodes: int) -> list[tuple[float, int, list]]:
    """Reference: (return, length, [states]) per episode, by gymnax's own auto-resetting `step` (the episode
    ends where it reports terminated or truncated), keys as `video` documents them (PRNGKey(seed + e))."""
    agent = sparqrl.load(run_dir)
    env, params = gymnax.make(env_id)
    result = []
    for e in range(episodes):
        key, reset_key = jax.random.split(jax.random.PRNGKey(seed + e))
        obs, state = env.reset(reset_key, params)
        states, total = [state], 0.0
        while True:
            key, step_key = jax.random.split(key)
            action = agent.act(np.asarray(obs), seed=policy_seed)
            obs, state, reward, terminated, truncated, info = env.step(step_key, state, action, params)
            total += float(reward)
            if terminated or truncated:
                # the state the episode ended in is not returned (auto-reset); its observation is
                states.append(np.asarray(info["final_observation"]))
                break
            states.append(state)
        result.append((total, len(states) - 1, states))
    return result


def cart_column(frame: np.ndarray) -> float:
    """The cart's centre column in a CartPole frame: the mean column of its dark pixels, in rows above the
    black track line (row 300) and below the pole's joint."""
    dark = frame[287:297].max(axis=-1) < 80
    return float(np.nonzero(dark)[1].mean())


def test_cartpole_video_holds_the_policys_episodes(cartpole_run, tmp_path, capsys):
    out = tmp_path / "cartpole.mp4"
    code, recording, err = cli(capsys, cartpole_run, "--video", out, "--episodes", 2, "--video-seed", 1,
                               "--seed", 7)
    assert code == 0, err
    reference = gymnax_episodes(cartpole_run, "CartPole-v1", policy_seed=1, seed=7, episodes=2)
    assert recording["episode_lengths"] == [length for _, length, _ in reference]
    np.testing.assert_allclose(recording["episode_returns"], [ret for ret, _, _ in reference])
    assert recording["frames"] == sum(length + 1 for _, length, _ in reference)
    assert recording["fps"] == 50.0 and (recording["height"], recording["width"]) == CARTPOLE_SIZE
    assert recording["video"] == str(out) and recording["policy_seed"] == 1 and recording["seed"] == 7

    frames = read_frames(out)
    assert frames.shape == (recording["frames"], *CARTPOLE_SIZE, 3)
    # The cart is drawn where the state puts it: Gymnasium's screen is 600 px for x in [-2.4, 2.4].
    first_length = reference[0][1]
    for index, state in ((0, reference[0][2][0]), (first_length, reference[0][2][-1])):
        x = float(state.x) if hasattr(state, "x") else float(state[0])
        assert abs(cart_column(frames[index]) - (300 + x * 125)) < 3, index
    assert not list(tmp_path.glob(".*partial*"))


@pytest.mark.parametrize("env_id", list(video.GYMNAX_TWINS))
def test_gymnax_state_maps_onto_its_gymnasium_twin(env_id):
    """The twin set from a gymnax state observes what gymnax observes, and steps to what gymnax steps to:
    the state fields are mapped in the right order and the twin draws the same system."""
    env, params = gymnax.make(env_id)
    twin = gym.make(env_id).unwrapped
    twin.reset(seed=0)
    for k in range(3):
        obs, state = env.reset(jax.random.PRNGKey(k), params)
        action = env.action_space(params).sample(jax.random.PRNGKey(100 + k))
        for name, value in video.GYMNAX_TWINS[env_id](state).items():
            setattr(twin, name, value)
        twin_obs = twin._get_ob() if env_id == "Acrobot-v1" else (
            twin._get_obs() if env_id == "Pendulum-v1" else np.asarray(twin.state))
        np.testing.assert_allclose(twin_obs, np.asarray(obs), atol=1e-6)
        next_obs, _, reward, _, _ = env.step_env(jax.random.PRNGKey(0), state, action, params)
        twin_next, twin_reward, *_ = twin.step(np.asarray(action) if np.ndim(action) else int(action))
        np.testing.assert_allclose(twin_next, np.asarray(next_obs), atol=1e-5)
        np.testing.assert_allclose(twin_reward, float(reward), atol=1e-5)


def test_existing_file_is_kept_unless_overwrite(cartpole_run, tmp_path, capsys):
    out = tmp_path / "keep.mp4"
    out.write_bytes(b"mine")
    code, _, err = cli(capsys, cartpole_run, "--video", out)
    assert code == 2 and "exists already (--overwrite replaces it)" in err and len(err.strip().splitlines()) == 1
    assert out.read_bytes() == b"mine"
    code, recording, err = cli(capsys, cartpole_run, "--video", out, "--overwrite")
    assert code == 0, err
    assert read_frames(out).shape[0] == recording["frames"] == recording["episode_lengths"][0] + 1


@pytest.mark.parametrize("argv, message", [
    (["--video", "{tmp}"], "is a folder"),
    (["--video", "{tmp}/clip.gif"], "must be a file name ending in .mp4"),
    (["--video", "{tmp}/no/such/clip.mp4"], "must be in an existing folder"),
    (["--video", "{tmp}/clip.mp4", "--video-seed", "2"], "--video-seed=2 is not allowed: must be an integer in [0, 2)"),
    (["--video", "{tmp}/clip.mp4", "--episodes", "0"], "--episodes=0 is not allowed"),
    (["--video-seed", "1"], "--video-seed=1 is not allowed: is only used with --video"),
])
def test_bad_arguments_are_one_line_errors(cartpole_run, tmp_path, capsys, argv, message):
    code, _, err = cli(capsys, cartpole_run, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2 and message in err and err.startswith("sparqrl: error:") and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_env_that_cannot_render_is_named_with_what_can(cartpole_run, tmp_path, capsys):
    minatar = tmp_path / "minatar"
    shutil.copytree(cartpole_run, minatar)
    config = json.loads((minatar / "config.json").read_text())
    config["run"]["env"] = "Breakout-MinAtar"
    (minatar / "config.json").write_text(json.dumps(config))
    code, _, err = cli(capsys, minatar, "--video", tmp_path / "b.mp4")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "env='Breakout-MinAtar' is not allowed: cannot be recorded" in err
    assert all(name in err for name in ("gym:ID", "brax:NAME", *video.GYMNAX_TWINS))
    assert not (tmp_path / "b.mp4").exists()
    with pytest.raises(ConfigError, match="cannot be recorded"):
        video.check_recordable("DeepSea-bsuite")


def test_missing_extra_names_the_install(cartpole_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if not installed
    code, _, err = cli(capsys, cartpole_run, "--video", tmp_path / "c.mp4")
    assert code == 2 and "needs imageio_ffmpeg" in err and "pip install 'sparqrl[video]'" in err
    assert len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_gym_env_video(tmp_path, capsys):
    """A host-env run (Ape-X DQN on gym:CartPole-v1, a few hundred steps): the video is the episode
    Gymnasium plays with the policy's action from reset seed --seed."""
    run = sparqrl.train("dqn", "gym:CartPole-v1", steps=300, out=tmp_path / "dqn", hidden=(16, 16),
                        learning_starts=100, batch_size=16, chunks=1, energy=False, eval_episodes=1, eval_every=0)
    out = tmp_path / "gym.mp4"
    code, recording, err = cli(capsys, run.path, "--video", out, "--seed", 3)
    assert code == 0, err
    agent, env = sparqrl.load(run.path), gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    total, length, over = 0.0, 0, False
    while not over:
        obs, reward, terminated, truncated, _ = env.step(int(agent.act(obs)))
        total, length, over = total + reward, length + 1, terminated or truncated
    assert recording["episode_lengths"] == [length] and recording["episode_returns"] == [total]
    assert read_frames(out).shape == (length + 1, *CARTPOLE_SIZE, 3)


MUJOCO_SCRIPT = """
import sys
from pathlib import Path
import numpy as np
from sparqrl import video
from sparqrl.config import ConfigError
video.headless_gl()
done = []
frames, fps = video.{source}({env!r}, lambda obs: np.zeros({actions}, np.float32), 0, 1, done)
try:
    count, height, width = video.write_mp4(frames, Path(sys.argv[1]), fps)
except ConfigError as error:
    if "could not render headless" in str(error):
        print("NO-GL", error)
        sys.exit(0)
    raise
print(count, height, width, fps, done[0][1])
"""


def render_mujoco(tmp_path, source: str, env: str, actions: int) -> tuple[np.ndarray, list[str]]:
    """Record one zero-action episode in a fresh process (MUJOCO_GL takes effect only before MuJoCo's
    first import); skip when this machine has no headless GL (setup.sh installs EGL)."""
    out = tmp_path / "mujoco.mp4"
    script = textwrap.dedent(MUJOCO_SCRIPT.format(source=source, env=env, actions=actions))
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    if last.startswith("NO-GL"):
        pytest.skip(f"no headless OpenGL here: {last}")
    return read_frames(out), last.split()


def test_mujoco_gym_env_renders_headless(tmp_path):
    frames, (count, height, width, fps, length) = render_mujoco(tmp_path, "gym_frames", "gym:InvertedPendulum-v5", 1)
    assert frames.shape == (int(length) + 1, 480, 480, 3) and int(count) == int(length) + 1
    assert float(fps) == 25.0  # 1 / (timestep 0.02 x frame_skip 2)
    assert frames[0].std() > 5  # a scene, not a blank image


@pytest.mark.slow
def test_brax_env_renders_headless(tmp_path):
    """brax:inverted_pendulum (its step compiles for about a minute on a small CPU machine, hence slow)."""
    frames, (count, height, width, fps, length) = render_mujoco(tmp_path, "brax_frames", "brax:inverted_pendulum", 1)
    assert frames.shape == (int(length) + 1, *video.BRAX_SIZE, 3) and int(count) == int(length) + 1
    assert frames[0].std() > 5


def test_a_recording_says_it_started_and_how_far_it_is(capsys, cartpole_run, tmp_path, monkeypatch):
    monkeypatch.setattr(video, "PROGRESS_EVERY_S", 0.0)  # a line after every frame
    code, recording, err = cli(capsys, cartpole_run, "--video", tmp_path / "v.mp4")
    lines = err.strip().splitlines()
    assert code == 0 and lines[0] == f"sparqrl: recording 1 episode of CartPole-v1 into {tmp_path / 'v.mp4'}"
    assert len(lines) == 1 + recording["frames"]
    assert lines[-1] == f"sparqrl: recording: episode 1 of 1, {recording['frames']:,} frames so far"


def test_a_recording_without_progress_says_nothing(capsys, cartpole_run, tmp_path, monkeypatch):
    monkeypatch.setattr(video, "PROGRESS_EVERY_S", 0.0)
    assert video.record(cartpole_run, tmp_path / "v.mp4", progress=False).frames > 0
    assert capsys.readouterr().err == ""
