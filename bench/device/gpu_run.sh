#!/usr/bin/env bash
# The GPU checks of one device session, run on the device machine from the repository root:
# onnxruntime-gpu installed from pieces carried earlier, then the device tests and profile
# mode beside exhaustive mode on ort-cpu,ort-cuda (no Ray on that machine: local runners).
#
# Why pieces: the onnxruntime-gpu 1.31.1 wheel (CUDA 13 build, 255 MB) is larger than one
# device call may carry (64 MiB). Here it travels as its CUDA provider library
# the rest of the package (a zstd tar) followed by its CUDA provider library (zstd; 284 MB,
# 186 MB compressed: its kernels hardly compress, zstd -22 --long gains 0.4%), concatenated
# into one file and cut into four pieces (split -n 4), each carried by one call as .whl/pN
# (ignored by git) and copied to /tmp/pc/ on the warm machine; this script, carried with the
# last piece, puts them together. REST_BYTES (the compressed tar's size) says where to cut.
#   usage: REST_BYTES=N bash bench/device/gpu_run.sh [bench models]
# The image has no zstd: carry this machine's /usr/bin/zstd and its liblz4.so.1 as .whl/zbin
# and put them on PATH / LD_LIBRARY_PATH before calling this script.
set -u -o pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/pc /tmp/site
cp .whl/p* /tmp/pc/ 2>/dev/null
cat $(ls /tmp/pc/p* | sort) > /tmp/all.bin || exit 3
ls -la /tmp/pc /tmp/all.bin
head -c "$REST_BYTES" /tmp/all.bin | zstd -dq | tar -x -C /tmp/site || exit 4
tail -c +"$((REST_BYTES + 1))" /tmp/all.bin > /tmp/cuda.zst
zstd -dq --long=31 /tmp/cuda.zst -o /tmp/site/onnxruntime/capi/libonnxruntime_providers_cuda.so \
  || exit 5
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, o.get_available_providers())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -m1 "Model name"; nproc; uptime
timeout 120 python3 -m pytest -m device tests/device -q -s -p no:cacheprovider 2>&1 \
  | tee "$out/device-tests.log" | tail -40
models=${1:-resnet18-64,bert-2L}
timeout 370 python3 -m bench.profile_mode --estimator local --targets ort-cpu,ort-cuda \
  --models "$models" --modes exhaustive,profile --out "$out/profile-mode-gpu.md" \
  --summaries "$out/sum" 2>&1 | tee "$out/bench.log" | grep -v "INFO\|WARNING" | tail -40
uptime
