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

# torchcodec (LeRobot's default video decoder on Linux) loads FFmpeg's shared libraries
# (libavutil.so.56-59 and the rest), which no wheel ships: install them from the system's
# packages when they are missing (as root, apt or dnf), else say what to install.
ffmpeg_libraries() {
    if ldconfig -p 2>/dev/null | grep -q 'libavutil\.so\.'; then
        return
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends ffmpeg > /dev/null
    elif [ "$(id -u)" = 0 ] && command -v dnf > /dev/null; then
        dnf install -y -q ffmpeg-free
    else
        echo "torchcodec needs FFmpeg's shared libraries: install ffmpeg (e.g. sudo apt-get" \
            "install ffmpeg), then run this again" >&2
        exit 1
    fi
}

setup() {
    ffmpeg_libraries
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
    # The oracle tests decode with torchcodec too: it must load here, not skip.
    "$env_dir/bin/python" -c "import torchcodec.decoders" \
        || { echo "torchcodec does not load in $env_dir (FFmpeg libraries?)" >&2; exit 1; }
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
