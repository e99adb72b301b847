"""How a run ends other than by finishing: the command turns these into one line and an exit status. Apart from
the session loop (`sparqrl.runners.session`, which raises them), so that the command catches them without
loading JAX."""


class RunInterrupted(Exception):
    """Raised after Ctrl-C / SIGTERM once the run has been left resumable."""


class RunFailed(Exception):
    """A run that cannot go on (non-finite values, a failed write, no intact checkpoint): one line
    that says what happened and what the folder still holds."""
