"""The argument parser of the commands tyro does not parse (`sparqrl eval`, `export`, `compare`, `meta`), kept
below every command that uses it so that no command module imports another."""

from __future__ import annotations

import argparse
import typing

from sparqrl.config import ConfigError, close_flags


class OneLineParser(argparse.ArgumentParser):
    """argparse for the commands tyro does not parse: a bad argument is a one-line `ConfigError`. No
    abbreviations: argparse would read `--generation 3` as `--generations 3` without a word."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args: typing.Sequence[str] | None = None, namespace: typing.Any = None) -> typing.Any:
        """argparse's, with an unknown flag answered by the command's flags spelled most alike."""
        parsed, extra = self.parse_known_args(args, namespace)
        flag = next((item.partition("=")[0] for item in extra if item.startswith("--")), None)
        if flag is not None:
            self.error(f"unknown option {flag}{close_flags(flag, self._option_string_actions)}")
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def add_import_flag(parser: argparse.ArgumentParser) -> None:
    """`--import MODULE` (repeatable) of a command that opens a run folder: args.imports, the modules the
    folder names that the user allows it to import (`sparqrl.trust`)."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="allow importing MODULE, which the run folder names (its imports or its env's module): "
                             "a run folder is data, so sparqrl imports what it names only when you name it too "
                             "(repeatable)")
