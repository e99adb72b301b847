import io

from rich.progress import Progress

from sparqrl.telemetry.progress import LineProgress, make_progress


def test_without_a_terminal_progress_is_a_complete_line_at_the_first_chunk_then_every_5_percent():
    stream = io.StringIO()
    progress = LineProgress(stream=stream)
    with progress:
        task = progress.add_task("ppo CartPole-v1", total=1000, sps=0.0, ret="-")
        progress.update(task, completed=0)
        for step in range(10, 1001, 10):
            progress.update(task, completed=step, sps=1234.5, ret="42.0")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 21
    assert lines[0].startswith("ppo CartPole-v1: 10/1,000 env steps (1%), return 42.0, 1,234 steps/s, ETA ")
    assert lines[1] == "ppo CartPole-v1: 50/1,000 env steps (5%), return 42.0, 1,234 steps/s, ETA " + lines[1][-8:]
    assert lines[-1].startswith("ppo CartPole-v1: 1,000/1,000 env steps (100%)") and lines[-1].endswith("00:00:00")


def test_a_resumed_run_counts_from_where_it_starts():
    stream = io.StringIO()
    progress = LineProgress(stream=stream)
    task = progress.add_task("dqn", total=100, sps=0.0, ret="-")
    progress.update(task, completed=52)  # resumed at 52 %
    for step in (53, 54, 55, 70, 100):
        progress.update(task, completed=step)
    assert [line.split(" env steps")[0] for line in stream.getvalue().splitlines()] == [
        "dqn: 53/100", "dqn: 55/100", "dqn: 70/100", "dqn: 100/100"]


def test_a_terminal_gets_the_bar_and_no_progress_gets_nothing():
    assert isinstance(make_progress(True, terminal=True), Progress)
    assert isinstance(make_progress(True, terminal=False), LineProgress)
    assert make_progress(False, terminal=False).disable
