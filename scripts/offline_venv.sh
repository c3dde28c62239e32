#!/usr/bin/env bash
# .venv over an interpreter that already holds torch (a GPU image, a cluster's module), for a
# machine with no network: nothing is downloaded.
#
#   bash scripts/offline_venv.sh WHEEL_DIR [BASE_PYTHON]      (BASE_PYTHON: default python3)
#
# WHEEL_DIR holds the wheels the base lacks, fetched beforehand on a machine with network for
# the base's Python and platform, e.g. for CPython 3.12 on x86-64 Linux:
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 -d WHEEL_DIR \
#       mpich mpi4py tomli-w pooch platformdirs tensorly
#
# The new venv sees the base's packages through a .pth file (a venv made from a venv does not),
# and its own mpi4py comes first: one built for the mpich wheel, whose mpiexec starts one
# world. With the base's mpi4py, bound to another MPI, mpich's mpiexec starts N worlds of one
# rank each; the last step here checks for that. lbtrain itself is installed editable.
set -eu
cd "$(dirname "$0")/.."
WHEELS=${1:?usage: offline_venv.sh WHEEL_DIR [BASE_PYTHON]}
BASE=${2:-python3}
[ -d "$WHEELS" ] || { echo "offline_venv: WHEEL_DIR $WHEELS is not a folder" >&2; exit 2; }
"$BASE" -c 'import torch' 2>/dev/null \
    || { echo "offline_venv: $BASE cannot import torch; name an interpreter that can" >&2; exit 2; }
site=$("$BASE" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# No pip of its own: the base's pip and setuptools, through the .pth file, are the ones that
# know its packages (a venv's bundled setuptools can be too old for pyproject.toml).
"$BASE" -m venv --without-pip .venv
own=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$own/base-site-packages.pth"
.venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip -q
.venv/bin/python -m pip install -q --no-index --no-deps --no-compile --ignore-installed "$WHEELS"/*.whl
.venv/bin/python -m pip install -q --no-index --no-deps --no-build-isolation -e .
# The base's console scripts stay in its own bin; torchrun is the one lbtrain's docs name.
printf '#!/bin/sh\nexec "%s" -m torch.distributed.run "$@"\n' "$PWD/.venv/bin/python" >.venv/bin/torchrun
chmod +x .venv/bin/torchrun
# Rank 0 of each world says its size: one world of 2 says "2" once.
size=$(.venv/bin/mpiexec -n 2 .venv/bin/python -c \
    'from mpi4py import MPI; c = MPI.COMM_WORLD; c.Get_rank() or print(c.Get_size())')
[ "$size" = 2 ] || { echo "offline_venv: mpiexec -n 2 did not start one world of 2 ranks (rank 0 said: $size)" >&2; exit 1; }
.venv/bin/python -c 'import lbtrain, torch; print(f"offline_venv: lbtrain with torch {torch.__version__}, CUDA {torch.cuda.is_available()}")'
