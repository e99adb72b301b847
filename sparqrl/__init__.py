"""sparqrl: fast, cheap deep reinforcement learning in JAX."""

__version__ = "0.1.0"
