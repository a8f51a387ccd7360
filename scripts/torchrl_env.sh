#!/usr/bin/env bash
# The peer of the priorities benchmark: TorchRL in its own environment, built once.
#   bash scripts/torchrl_env.sh            prints the environment's python when it is ready
# TorchRL's wheels carry C++ segment trees built for one torch (0.14.x: torch 2.14, whose
# PyPI build needs several GB of CUDA libraries; 0.13.3: torch <= 2.12).  Here the peer is
# TorchRL's release wheel on the project's CPU torch (2.13.0), with its C++ extension
# (torchrl/csrc: the segment trees) rebuilt from TorchRL's source against that torch.
#   TORCHRL_ENV      the environment (default /work/venvs/torchrl)
#   TORCHRL_SRC      a TorchRL git checkout or bare repository (default: the mirror at
#                    /work/.mirror/pytorch+rl/repo); TORCHRL_REF its revision (HEAD)
#   TORCHRL_VERSION  the release wheel (0.14.1), TENSORDICT_VERSION (0.14.3)
set -euo pipefail
env_dir="${TORCHRL_ENV:-/work/venvs/torchrl}"
src="${TORCHRL_SRC:-/work/.mirror/pytorch+rl/repo}"
ref="${TORCHRL_REF:-HEAD}"
py="${PYTHON:-python3}"
torch_version="${TORCHRL_TORCH:-2.13.0+cpu}"
torchrl_version="${TORCHRL_VERSION:-0.14.1}"
tensordict_version="${TENSORDICT_VERSION:-0.14.3}"
check='from torchrl._torchrl import SumSegmentTreeFp32; SumSegmentTreeFp32(8)'
if "$env_dir/bin/python" -c "$check" 2>/dev/null; then
    echo "$env_dir/bin/python"
    exit 0
fi
if [ ! -x "$env_dir/bin/python" ]; then
    "$py" -m venv "$env_dir" >&2
fi
pip=("$env_dir/bin/pip" install --quiet)
"${pip[@]}" "torch==$torch_version" >&2
"${pip[@]}" "tensordict==$tensordict_version" "torchrl==$torchrl_version" \
    "torch==$torch_version" >&2
# The C++ extension, from the source's torchrl/csrc, against this environment's torch.
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
mkdir -p "$build/torchrl/csrc"
git --git-dir="$(git -C "$src" rev-parse --absolute-git-dir)" \
    archive "$ref" torchrl/csrc | tar -x -C "$build"
"$env_dir/bin/pip" install --quiet ninja setuptools >&2
(
    cd "$build"
    "$env_dir/bin/python" - >&2 <<'PY'
import glob
import os
import shutil
import sysconfig

import torchrl
from torch.utils.cpp_extension import load

module = load(
    name="_torchrl",
    sources=sorted(glob.glob("torchrl/csrc/*.cpp")),
    extra_include_paths=[os.getcwd()],
    extra_cflags=["-O3", "-std=c++20"],
    build_directory=os.getcwd(),
    verbose=False,
)
target = os.path.join(
    os.path.dirname(torchrl.__file__), "_torchrl" + sysconfig.get_config_var("EXT_SUFFIX")
)
shutil.copyfile(module.__file__, target)
PY
)
"$env_dir/bin/python" -c "$check" >&2
echo "$env_dir/bin/python"
