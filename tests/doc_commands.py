"""The `sparqrl ...` commands that README.md and docs/ show, shrunk to a CI budget (tests/test_documented_commands.py).

Every fenced code block of README.md and docs/**/*.md is read: lines joined where they end in `\\`, split at `&&`,
`||`, `;` and `|`, and each part whose first word is `sparqrl` (bare or a path to it, e.g. `.venv/bin/sparqrl`) is a
command. A command that cannot run in CI says so in the docs with the words `not in CI: WHY`, either in its
trailing shell comment (`... --out runs/i   # not in CI: needs a running Ray cluster`) or in an HTML comment on
a line directly above its code block (`<!-- not in CI: synopses, not commands -->`: every command of the block).

`shrink` keeps a command's meaning and cuts its cost: the budget flags (steps, generations, population, games,
samples, seeds above MAX_SEEDS, a run's evaluation episodes) get tiny values, the algorithm's sizes are set small
with `--set`, and a command that writes a run without naming `--out` gets a folder of its own. Two commands whose shrunk forms are equal (the same program,
from the same kind of folder) run once; see `plan`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"not in CI:\s*(.*?)\s*(?:-->\s*)?$")
FENCE = re.compile(r"^\s*(```|~~~)")
SEPARATORS = re.compile(r"\s(?:&&|\|\||;|\|)\s")
QUIET = ("--no-progress", "--no-energy")

# Tiny sizes per algorithm, as `--set` items (fields of the algorithm's Config), and its env steps per seed.
TRAIN = {
    "ppo": ("2048", ["num_envs=4", "num_steps=32"]),
    "impala": ("2048", ["num_envs=4", "num_steps=32"]),
    "a2c": ("2048", ["num_envs=4", "num_steps=5"]),
    "dqn": ("2048", ["num_envs=4", "learning_starts=256", "batch_size=32"]),
    "td3": ("1024", ["learning_starts=128", "batch_size=32", "buffer_min_size=256", "buffer_check_interval=256",
                     "topology_interval=256"]),
    "sac": ("1024", ["learning_starts=128", "batch_size=32", "buffer_min_size=256", "buffer_check_interval=256",
                     "topology_interval=256"]),
}
# The inner trainings of a meta run: its --steps and --set items.
META_INNER = {
    "ppo": ("128", ["num_envs=4", "num_steps=16", "num_minibatches=1", "update_epochs=1", "hidden=16,16"]),
    "dqn": ("512", ["num_envs=4", "learning_starts=64", "batch_size=16", "hidden=16,16"]),
    "td3": ("256", ["learning_starts=64", "batch_size=16", "hidden=16,16"]),
    "sac": ("256", ["learning_starts=64", "batch_size=16", "hidden=16,16"]),
}
GENERATIONS = 2  # a meta run's; `meta --resume DIR --generations N` goes on to GENERATIONS + 1
MAX_SEEDS = 4  # more seeds than CPU devices (2 or more per device) is the layout that must not hang


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, its arguments after `sparqrl`, and why it does not run in CI (or
    None)."""

    doc: str  # path relative to the repository root
    line: int  # 1-based line of its first line
    argv: tuple[str, ...]
    not_in_ci: str | None

    @property
    def text(self) -> str:
        return "sparqrl " + shlex.join(self.argv)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def documents() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _block_mark(lines: list[str], fence: int) -> str | None:
    """The `not in CI:` reason of an HTML comment among the comment lines directly above line `fence`."""
    i = fence - 1
    while i >= 0 and lines[i].strip().startswith("<!--"):
        if found := MARK.search(lines[i].strip()):
            return found.group(1)
        i -= 1
    return None


def _logical_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(first line number, text) of a block's shell lines, `\\` continuations joined."""
    joined: list[tuple[int, str]] = []
    start, parts = None, []
    for number, text in block:
        code = text.rstrip()
        if start is None:
            start = number
        if code.endswith("\\"):
            parts.append(code[:-1])
            continue
        parts.append(code)
        joined.append((start, " ".join(parts)))
        start, parts = None, []
    if parts:
        joined.append((start, " ".join(parts)))
    return joined


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: the comment starts at the first `#` outside quotes that begins a word."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def _is_sparqrl(word: str) -> bool:
    return word == "sparqrl" or word.endswith("/sparqrl")


def commands(path: Path) -> list[Command]:
    """Every `sparqrl` command in the fenced code blocks of the Markdown file `path`, in order."""
    lines = path.read_text().splitlines()
    doc = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    found: list[Command] = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        block_mark, block, i = _block_mark(lines, i), [], i + 1
        while i < len(lines) and not FENCE.match(lines[i]):
            block.append((i + 1, lines[i]))
            i += 1
        i += 1
        for number, line in _logical_lines(block):
            code, comment = _split_comment(line)
            mark = MARK.search(comment)
            for part in SEPARATORS.split(code):
                words = part.split()
                if words and _is_sparqrl(words[0]):
                    found.append(Command(doc, number, tuple(shlex.split(part)[1:]),
                                         mark.group(1) if mark else block_mark))
    return found


def all_commands() -> list[Command]:
    return [command for path in documents() for command in commands(path)]


# ---- shrinking ----------------------------------------------------------------------------------


def _drop(argv: list[str], flag: str) -> tuple[list[str], str | None]:
    """argv without `flag VALUE` (or `flag=VALUE`), and the value it had (None: absent)."""
    out, value, i = [], None, 0
    while i < len(argv):
        if argv[i] == flag and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        elif argv[i].startswith(flag + "="):
            value, i = argv[i].split("=", 1)[1], i + 1
        else:
            out.append(argv[i])
            i += 1
    return out, value


def _sets(items: list[str]) -> list[str]:
    return [word for item in items for word in ("--set", item)]


def _budget(table: dict[str, tuple[str, list[str]]], algo: str) -> tuple[str, list[str]]:
    if algo not in table:
        raise ValueError(f"no CI budget for algorithm {algo!r} in tests/doc_commands.py: add one")
    return table[algo]


def _cap_seeds(argv: list[str]) -> list[str]:
    argv, seeds = _drop(argv, "--seeds")
    return argv + ["--seeds", str(min(int(seeds), MAX_SEEDS))] if seeds else argv


def _shrink_train(argv: list[str], out: str) -> list[str]:
    if "--resume" in argv:
        return argv + list(QUIET)
    steps, sets = _budget(TRAIN, argv[1])
    argv, _ = _drop(argv, "--steps")
    argv = _cap_seeds(argv)
    if "--out" not in argv:
        argv += ["--out", out]
    # A host env's evaluation steps whole episodes one by one (HalfCheetah: 1000 steps each, never terminated).
    return argv + ["--steps", steps, *_sets(sets), "--eval-episodes", "2", *QUIET]


def _shrink_sweep(argv: list[str], out: str) -> list[str]:
    if "--resume" in argv:
        return argv + list(QUIET)
    steps, sets = _budget(TRAIN, argv[1])
    argv, _ = _drop(argv, "--steps")
    argv, samples = _drop(argv, "--samples")
    argv = _cap_seeds(argv)
    if samples:
        argv += ["--samples", "2"]
    if "--out" not in argv:
        argv += ["--out", out]
    return argv + ["--steps", steps, *_sets(sets), *QUIET]


def _shrink_meta(argv: list[str], out: str) -> list[str]:
    argv, _ = _drop(argv, "--generations")
    if "--resume" in argv:
        return argv + ["--generations", str(GENERATIONS + 1), "--no-progress"]  # the only other flag it takes
    task = argv[1]
    for flag in ("--popsize", "--steps", "--games"):
        argv, _ = _drop(argv, flag)
    argv += ["--generations", str(GENERATIONS)]
    if "--out" not in argv:
        argv += ["--out", out]
    if task == "mfos":
        _, trainer = _drop(argv, "--trainer")
        return argv + (["--games", "16"] if trainer == "ppo" else ["--popsize", "4", "--games", "8"]) + list(QUIET)
    _, algo = _drop(argv, "--algo")
    steps, sets = _budget(META_INNER, algo or "ppo")
    argv, _ = _drop(argv, "--seeds")
    return argv + ["--popsize", "4", "--seeds", "1", "--steps", steps, *_sets(sets), *QUIET]


def shrink(command: Command, out: str) -> list[str]:
    """The command's argv at a CI budget; `out` is the folder it writes its run to when the docs name none."""
    argv = list(command.argv)
    if not argv or "--help" in argv or "-h" in argv:
        return argv
    shrinkers = {"train": _shrink_train, "sweep": _shrink_sweep, "meta": _shrink_meta, "pbt": _shrink_train}
    if argv[0] in shrinkers:
        return shrinkers[argv[0]](argv, out)
    return argv


def writes(argv: list[str]) -> str | None:
    """The run folder a shrunk command writes (train, sweep, meta, pbt, and their --resume), or None."""
    if argv and argv[0] in ("train", "sweep", "meta", "pbt") and "--help" not in argv:
        _, resume = _drop(argv, "--resume")
        _, out = _drop(argv, "--out")
        return resume or out
    return None


def reads(argv: list[str], folders: list[str]) -> list[str]:
    """Which of `folders` (written by earlier commands) the command uses: a word, or a part of one between `:`
    or `=`, that is the folder or a path under it."""
    parts = {piece for word in argv for piece in re.split(r"[:=]", word)}
    return [folder for folder in folders if any(p == folder or p.startswith(folder + "/") for p in parts)]


# ---- what runs, in which order ------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """A documented command as it runs in CI."""

    command: Command
    argv: tuple[str, ...]  # shrunk
    key: str  # equal for two steps that run the same program on the same kind of folder (`_key`)

    @property
    def writes(self) -> str | None:
        return writes(list(self.argv))

    def reads(self, folders) -> list[str]:
        return reads(list(self.argv), list(folders))


def _key(argv: list[str], folders: dict[str, str]) -> str:
    """What makes two shrunk commands the same: their words, with the folder a command writes left out and each
    folder it reads replaced by the key of the command that last wrote it."""
    argv, _ = _drop(argv, "--out") if argv and argv[0] in ("train", "sweep", "meta", "pbt") else (argv, None)
    words = shlex.join(argv)
    for folder in sorted(folders, key=len, reverse=True):
        words = re.sub(rf"(?<![\w./-]){re.escape(folder)}(?=$|[\s/:])", "{" + folders[folder] + "}", words)
    return words


def _steps(commands: list[Command]) -> list[Step]:
    """One document's commands that run in CI, shrunk, in order. Raises ValueError where one reads a folder that
    only a command not in CI writes."""
    steps: list[Step] = []
    folders: dict[str, str] = {}  # folder -> key of its latest writer
    skipped: dict[str, Command] = {}  # folder -> the command not in CI that writes it
    for command in commands:
        if command.not_in_ci:
            if folder := writes(list(command.argv)):
                skipped[folder] = command
            continue
        argv = shrink(command, f"runs/ci-{command.line}")
        for folder in reads(argv, [f for f in skipped if f not in folders]):
            raise ValueError(f"{command.where}: `{command.text}` reads {folder}, which only "
                             f"{skipped[folder].where} (not in CI) writes: mark it not in CI too")
        steps.append(Step(command, tuple(argv), _key(argv, folders)))
        if folder := writes(argv):
            folders[folder] = steps[-1].key
    return steps


def _chains(steps: list[Step]) -> list[list[Step]]:
    """Steps split into chains linked by folders (one writes, a later one reads), each in the given order."""
    chain_of: dict[str, int] = {}  # folder -> chain index
    chains: list[list[Step]] = []
    for step in steps:
        linked = sorted({chain_of[f] for f in step.reads(chain_of)})
        if not linked:
            chains.append([])
            linked = [len(chains) - 1]
        target = linked[0]
        for other in linked[1:]:  # a step reading two chains' folders joins them
            chains[target] += chains[other]
            chains[other] = []
            chain_of.update({f: target for f, c in chain_of.items() if c == other})
        chains[target].append(step)
        if step.writes:
            chain_of[step.writes] = target
    order = {id(step): i for i, step in enumerate(steps)}
    return [sorted(chain, key=lambda s: order[id(s)]) for chain in chains if chain]


def _needed(chain: list[Step], seen: set[str]) -> list[Step]:
    """The chain without the steps whose key is in `seen`, except those that write a folder a kept step reads
    (the latest earlier writer of each)."""
    keep = [step.key not in seen for step in chain]
    for i in reversed(range(len(chain))):
        if keep[i]:
            for folder in chain[i].reads({s.writes for s in chain[:i]} - {None}):
                keep[max(j for j in range(i) if chain[j].writes == folder)] = True
    return [step for step, kept in zip(chain, keep) if kept]


def plan(commands: list[Command]) -> list[list[Step]]:
    """The chains of steps to run, each in a fresh folder and in document order: one document's commands linked
    by the run folders one writes and a later one reads. A step whose key another step already has is left out
    (longer chains keep theirs first), unless a kept step of its chain reads the folder it writes."""
    chains = [chain for doc in dict.fromkeys(c.doc for c in commands)
              for chain in _chains(_steps([c for c in commands if c.doc == doc]))]
    seen: set[str] = set()
    kept: list[list[Step]] = []
    for chain in sorted(chains, key=len, reverse=True):
        kept += _chains(_needed(chain, seen))
        seen |= {step.key for step in chain}
    position = {command: i for i, command in enumerate(commands)}
    return sorted(kept, key=lambda chain: position[chain[0].command])
