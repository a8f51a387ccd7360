#!/usr/bin/env bash
# Set up a virtual environment in .venv (once) and run a job in it.
#   bash scripts/dev.sh demo [ARGS...]   the main job: a demo on a local store
#   bash scripts/dev.sh test [ARGS...]   lint, type check and the full test suite
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
    *)
        echo "usage: bash scripts/dev.sh demo|test [ARGS...]" >&2
        exit 2
        ;;
esac
