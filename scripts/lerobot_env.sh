#!/usr/bin/env bash
# LeRobot 0.6 needs Python >= 3.12, so its oracle tests run in a second environment
# (.venv-lerobot, about 5.5 GB with PyPI's CUDA torch), apart from the project's .venv.
#   bash scripts/lerobot_env.sh setup            build the environment (once)
#   bash scripts/lerobot_env.sh test [ARGS...]   the dataset oracle tests in it
# PYTHON312 names the interpreter; by default the newest pyenv 3.12, then python3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${LEROBOT_ENV:-.venv-lerobot}"
job="${1:-}"
shift || true

find_python() {
    if [ -n "${PYTHON312:-}" ]; then
        echo "$PYTHON312"
        return
    fi
    local found
    found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null \
        | sort -V | tail -n 1 || true)
    if [ -n "$found" ]; then
        echo "$found"
    else
        command -v python3.12
    fi
}

setup() {
    if [ ! -x "$env_dir/bin/python" ]; then
        "$(find_python)" -m venv "$env_dir"
    fi
    if ! "$env_dir/bin/python" -c "import lerobot.datasets.lerobot_dataset" 2>/dev/null; then
        "$env_dir/bin/pip" install --quiet 'lerobot[dataset]==0.6.1'
    fi
    # rbzarr from this checkout with its datasets extra (minari too), and what the tests'
    # conftest and the oracle tests use (s3fs, moto: the S3 fixtures; jax: Minari's
    # DataCollector).  s3fs follows the fsspec that LeRobot's datasets pins.
    local fsspec_version
    fsspec_version=$("$env_dir/bin/python" -c "import fsspec; print(fsspec.__version__)")
    "$env_dir/bin/pip" install --quiet -e '.[datasets]' pytest pytest-timeout hypothesis jax \
        "s3fs==$fsspec_version" 'moto[s3]' flask flask-cors boto3
}

case "$job" in
    setup)
        setup
        ;;
    test)
        setup
        exec "$env_dir/bin/python" -m pytest tests/test_lerobot_oracle.py tests/test_minari.py "$@"
        ;;
    *)
        echo "usage: bash scripts/lerobot_env.sh setup|test [ARGS...]" >&2
        exit 2
        ;;
esac
