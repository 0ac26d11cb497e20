#!/bin/bash
# On an offline CUDA machine with Python 3.12 and PyTorch, CUDA's compiler, CMake and ninja
# (an NVIDIA PyTorch image), in a checkout holding the folder bench/gpu/wheelhouse.sh made:
#
#   bench/gpu/on_device.sh build HOUSE     start the CUDA build of llama-cpp-python (in the
#                                          background: 3.5-4 min on 16 cores for sm_90)
#   bench/gpu/on_device.sh stage HOUSE     keep the parts present now (a transfer at a time)
#   bench/gpu/on_device.sh install HOUSE   wait for the build, install all in $SITE
#   bench/gpu/on_device.sh check           which libraries crash beside the CUDA llama.cpp
#   bench/gpu/on_device.sh bench ARGS...   bench/voice.py with every layer on the GPU
#
# Work files go to $WORK (/tmp/mythic-gpu), packages to $SITE (/tmp/mythic-site).
set -u
WORK=${WORK:-/tmp/mythic-gpu}; SITE=${SITE:-/tmp/mythic-site}; ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$WORK/parts" "$WORK/house" "$WORK/wheel"
nvcc_path() { command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1; }
env_setup() {
  export PATH=$WORK/deb/usr/bin:$PATH
  export LD_LIBRARY_PATH=$WORK/deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PYTHONPATH=$SITE:$ROOT/src HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
}
case ${1:-} in
build)
  tar xzf "$2/llama_trim.tar.gz" -C "$WORK"
  NVCC=$(nvcc_path); [ -n "$NVCC" ] || { echo "no nvcc: CUDA's compiler is needed"; exit 3; }
  export CUDACXX=$NVCC PATH=$(dirname "$NVCC"):$PATH
  args="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_CUDA_NCCL=OFF"
  args="$args -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  args="$args -DLLAMA_BUILD_TOOLS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON"
  args="$args -DGGML_FMA=ON -DGGML_F16C=ON"
  rm -f "$WORK/build.rc"; date +%s > "$WORK/build.start"
  # The build's end is a file (build.rc, its exit status), not a pid: a later call on the
  # device machine may not see this call's processes.
  cat > "$WORK/build.sh" <<BUILD
cd "$WORK/trim" && CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip wheel \\
  --no-deps --no-build-isolation --no-cache-dir -v -w "$WORK/wheel" . > "$WORK/build.log" 2>&1
echo \$? > "$WORK/build.rc.tmp"; date +%s > "$WORK/build.end"; mv "$WORK/build.rc.tmp" "$WORK/build.rc"
BUILD
  setsid nohup bash "$WORK/build.sh" > /dev/null 2>&1 < /dev/null &
  echo "building (log: $WORK/build.log)";;
stage)
  cp "$2"/part* "$WORK/parts/" 2>/dev/null
  cat "$WORK"/parts/part* > "$WORK/house.tar"
  (cd "$WORK/house" && tar xf ../house.tar 2>/dev/null)
  echo "parts: $(ls "$WORK/parts" | tr '\n' ' ')"
  grep -oE '^\s*\[[0-9]+/[0-9]+\]' "$WORK/build.log" 2>/dev/null | tail -1
  if [ -e "$WORK/build.rc" ]; then echo "build done: rc $(cat "$WORK/build.rc")"; fi;;
install)
  "$0" stage "$2"
  [ -e "$WORK/build.start" ] || { echo "no build started: run build first"; exit 3; }
  # 9 min at most, inside a call's 10; a build still going is waited for by a next install.
  for _ in $(seq 180); do [ -e "$WORK/build.rc" ] && break; sleep 3; done
  [ "$(cat "$WORK/build.rc" 2>/dev/null)" = 0 ] && ls "$WORK"/wheel/llama_cpp_python-*.whl >/dev/null 2>&1 \
    || { tail -c 3000 "$WORK/build.log"; echo "the build failed or is not done"; exit 3; }
  echo "built in $(( $(cat "$WORK/build.end") - $(cat "$WORK/build.start") )) s"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WORK"/house/*.whl "$WORK"/wheel/*.whl || exit 4
  python3 -m zipfile -e "$WORK/house/piper_trim.zip" "$SITE"
  for f in "$WORK"/house/debs/*.deb; do dpkg -x "$f" "$WORK/deb"; done
  env_setup; python3 -m mythic models fetch smollm2-135m-instruct;;
check)
  # Each in a process of its own: the model on the GPU first, as in the server, then one
  # library the server or its speech stack loads. A crash names the culprit.
  env_setup
  load="from mythic.engine._llamacpp import load_backend; from mythic.config import EngineSettings
b = load_backend('smollm2-135m-instruct', EngineSettings(n_gpu_layers=-1))"
  vad="from mythic.speech._vad import SileroVAD; SileroVAD().probability(bytes(1024))"
  # bm25s is imported as Mythic does (without JAX); JAX's own import crashed beside the model
  # there once, inside ml_dtypes (numpy and ml_dtypes show whether it is JAX or numpy's math).
  bm25="from mythic.knowledge._index import _bm25s; _bm25s().BM25()"
  numpy="import numpy as np; np.linalg.svd(np.random.rand(64, 64)); np.finfo(np.float16)"
  for probe in "pass" "$numpy" "import ml_dtypes" "$bm25" "import bm25s" "import onnxruntime" \
      "$vad" "import faster_whisper" \
      "import ctranslate2" "import torch" "import torch; torch.zeros(1).cuda()"; do
    timeout 120 python3 -c "$load
$probe" >/dev/null 2>&1; echo "rc=$? after the model: $probe"
  done
  # The other way round: libraries that crashed after the model, imported before it (the
  # engine does so for onnxruntime: IMPORT_BEFORE_CUDA), then used after it.
  for probe in "import ml_dtypes|import ml_dtypes, numpy; numpy.zeros(2, ml_dtypes.bfloat16)" \
      "import torch|(torch.zeros(64, 64) @ torch.ones(64, 64)).sum()" \
      "import torch|torch.zeros(1).cuda()"; do
    timeout 120 python3 -c "${probe%%|*}
$load
${probe#*|}" >/dev/null 2>&1; echo "rc=$? imported before the model: $probe"
  done;;
bench)
  # BENCH_LIMIT_S (default 420): past it, the server gets SIGABRT, so that the fault handler
  # writes every thread's stack to its log (--server-log), and the bench is stopped. Lore by
  # BM25 alone: the MiniLM embedder's packages are not in the wheelhouse.
  shift; env_setup
  export MYTHIC_ENGINE__N_GPU_LAYERS=${MYTHIC_ENGINE__N_GPU_LAYERS:--1}
  export MYTHIC_KNOWLEDGE__RETRIEVAL=${MYTHIC_KNOWLEDGE__RETRIEVAL:-bm25}
  python3 "$ROOT/bench/voice.py" "$@" & pid=$!
  (sleep "${BENCH_LIMIT_S:-420}"; kill -0 "$pid" 2>/dev/null || exit 0
   echo "past ${BENCH_LIMIT_S:-420} s: SIGABRT to the server for its stacks"
   pkill -ABRT -f "mythic serve"; sleep 3; kill "$pid") & watchdog=$!
  # The watchdog's sleep goes with it: it holds this script's output open.
  wait "$pid"; rc=$?; pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null
  exit "$rc";;
*)
  sed -n 2,12p "$0"; exit 2;;
esac
