# Shared by the peers' set-up scripts (sourced): a venv of the peer's own and a version check.

# make_venv DIR: create the venv DIR (with $PYTHON, default python3.11, else python3) unless it exists;
# sets PY to its interpreter.
make_venv() {
    local python="${PYTHON:-python3.11}"
    command -v "$python" >/dev/null 2>&1 || python=python3
    if [ ! -x "$1/bin/python" ]; then
        echo "creating $1 with $($python -V)"
        "$python" -m venv "$1"
    fi
    PY="$1/bin/python"
}

# have PACKAGE VERSION-PREFIX: the version installed in $PY starts with it
have() {
    "$PY" - "$1" "$2" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version(sys.argv[1]).startswith(sys.argv[2]) else 1)
PYEOF
}
