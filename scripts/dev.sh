#!/usr/bin/env bash
# Set up a virtual environment in .venv (once) and run a job in it.
#   bash scripts/dev.sh demo [ARGS...]   the main job: a demo on a local store
#   bash scripts/dev.sh test [ARGS...]   lint, type check and the full test suite
#   bash scripts/dev.sh bench [ARGS...]  python -m benchmarks with its peers (TorchRL,
#                                        MuJoCo frames, moto): e.g. --suites images
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-}"
shift || true
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
fi
# torch first and pinned: an open range would pull a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install --quiet torch==2.13.0
fi
case "$job" in
    demo)
        .venv/bin/pip install --quiet -c scripts/constraints.txt -e '.[demo]'
        exec .venv/bin/rbzarr demo "$@"
        ;;
    test)
        .venv/bin/pip install --quiet -c scripts/constraints.txt -e '.[dev]'
        # RLinf is the tests' oracle. Its own dependency tree (ray, transformers, ...) must
        # not come with it: its buffer imports with omegaconf alone (in the test extra).
        .venv/bin/pip install --quiet --no-deps -c scripts/constraints.txt rlinf==0.3.0
        # tests/test_report_browser.py opens `rbzarr report`'s page in headless Chromium
        # (Debian's packages; CI runs as root on Debian).
        if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
        fi
        .venv/bin/ruff format --check rbzarr tests benchmarks
        .venv/bin/ruff check rbzarr tests benchmarks
        .venv/bin/mypy rbzarr
        exec .venv/bin/pytest "$@"
        ;;
    bench)
        # The peers: TorchRL's storages (pure Python on any torch >= 2.1: its C++ segment
        # trees, built for one torch, are not used here), MuJoCo renders, the S3 server.
        # The installed torch is a requirement of the same install, so nothing upgrades it.
        torch_pin="torch==$(.venv/bin/python -c 'import torch; print(torch.__version__)')"
        .venv/bin/pip install --quiet -c scripts/constraints.txt -e '.[bench-images,test]' \
            "$torch_pin"
        export MUJOCO_GL="${MUJOCO_GL:-egl}"
        exec .venv/bin/python -m benchmarks "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh demo|test|bench [ARGS...]" >&2
        exit 2
        ;;
esac
