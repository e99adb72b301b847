import os

# Tests run on the CPU, in float32, and must not grab all memory on a GPU machine.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
