#!/usr/bin/env bash
# Set up everything vision_rag_pipeline needs, idempotently: Debian packages (Tesseract with its
# languages, fonts and Chromium for the tests), then a virtual environment in .venv with the CPU
# build of torch, then the project with its dev extras. A re-run checks and installs nothing, and
# prints nothing.
#
# Debian packages are installed as root, or through sudo; without either, the one command to run as
# root is printed and the setup goes on without them (it then fails at the end if Tesseract itself
# is missing, which ingest cannot do without).
# Variables: PYTHON (interpreter for .venv), VISION_RAG_SKIP_BROWSER=1 (no Chromium),
# VISION_RAG_TORCH_INDEX (PyTorch's CPU wheel index, default https://download.pytorch.org/whl/cpu;
# set it to a mirror of that index, or to nothing for the default index only).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages, one a line. Required: ingest needs them. Optional: more OCR languages
# (media_enrichment.ocr.languages picks among them), fonts for the generated test pages,
# Chromium for the browser test.
REQUIRED_PACKAGES=(
  tesseract-ocr
  tesseract-ocr-eng
)
OPTIONAL_PACKAGES=(
  tesseract-ocr-chi-sim
  tesseract-ocr-chi-tra
  tesseract-ocr-rus
  tesseract-ocr-ukr
  tesseract-ocr-deu
  tesseract-ocr-fra
  tesseract-ocr-spa
  tesseract-ocr-ita
  tesseract-ocr-por
  tesseract-ocr-jpn
  tesseract-ocr-kor
  fonts-noto-cjk
  fonts-dejavu-core
  redis-server  # the Celery broker of the multi-host test (test_multihost.py starts its own server)
)
[ "${VISION_RAG_SKIP_BROWSER:-}" = 1 ] || OPTIONAL_PACKAGES+=(chromium)

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
# Without Debian's python3-venv, `python3 -m venv` fails; ensurepip is what that package adds.
if [ ! -x .venv/bin/python ] && ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  REQUIRED_PACKAGES+=(python3-venv)
fi

# The packages of "$@" that dpkg does not list as installed, one a line. (No `producer | grep -q`:
# under pipefail, grep exiting at its first match fails the producer with SIGPIPE.)
not_installed() {
  local -A state=()
  local name abbrev
  while read -r name abbrev; do state[$name]=$abbrev; done < <(
    dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "$@" 2>/dev/null || true)
  for name in "$@"; do [ "${state[$name]:-}" = ii ] || echo "$name"; done
}

missing_required=()
missing=()
if command -v dpkg-query >/dev/null; then
  mapfile -t missing_required < <(not_installed "${REQUIRED_PACKAGES[@]}")
  mapfile -t missing < <(not_installed "${REQUIRED_PACKAGES[@]}" "${OPTIONAL_PACKAGES[@]}")
elif ! command -v tesseract >/dev/null; then
  echo "setup: not a Debian system: install Tesseract (with English) yourself" >&2
  missing_required=(tesseract)
fi

if [ ${#missing[@]} -gt 0 ]; then
  as_root=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
      as_root=(sudo)
    else
      as_root=(none)
    fi
  fi
  if [ "${as_root[*]}" = none ]; then
    echo "setup: not root and no sudo: going on without ${missing[*]}; to install them, run as root:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  else
    echo "setup: installing ${missing[*]}" >&2
    "${as_root[@]}" apt-get update -qq
    if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
      echo "setup: some optional packages could not be installed; installing the required ones" >&2
      if [ ${#missing_required[@]} -gt 0 ]; then
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
          apt-get install -y -qq --no-install-recommends "${missing_required[@]}" >/dev/null
      fi
    fi
    missing_required=()
  fi
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv; then
    rm -rf .venv
    echo "setup: $PYTHON cannot create a virtual environment (Debian: python3-venv, see above)" >&2
    exit 1
  fi
  echo "setup: created .venv with $PYTHON" >&2
fi

# torch's CPU build, before the project, so nothing pulls the CUDA build (2.7 GB of nvidia-* wheels):
# from PyTorch's CPU index where it answers; otherwise the default index, where pip's own
# configuration may offer a CPU wheel (find-links, a mirror), or else PyPI's CUDA build.
install_torch() {
  local version index
  version=$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' pyproject.toml)
  index=${VISION_RAG_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
  if [ -n "$index" ] && .venv/bin/python - "$index" 2>/dev/null <<'PY'
import sys
import urllib.request

urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=15).close()
PY
  then
    echo "setup: torch $version (CPU build) from $index" >&2
    .venv/bin/python -m pip install -q --extra-index-url "$index" "torch==$version+cpu"
  else
    [ -z "$index" ] || echo "setup: $index does not answer; torch $version from the default index" >&2
    .venv/bin/python -m pip install -q "torch==$version"
  fi
}

# Reinstall only when the dependency list changed since the last successful install.
stamp=.venv/.vision_rag_installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first time: a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  install_torch
  # setuptools tells every editable install of this (flat) layout that a folder named like the
  # package may shadow it: a BuildBackendWarning "Editable installation." about any checkout, nothing
  # to act on. Only that message is silenced.
  PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
    .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
  .venv/bin/python - >&2 <<'PY'
import importlib.metadata as metadata
import subprocess

torch = metadata.version("torch")
nvidia = sorted(d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].lower().startswith("nvidia-"))
size = subprocess.run(["du", "-sh", ".venv"], capture_output=True, text=True).stdout.split()[0]
print(f"setup: .venv holds {size}, torch {torch}, {len(nvidia)} nvidia-* packages")
if nvidia:
    print("setup: this is the CUDA build of torch (the CPU build was not offered); for the CPU build set "
          "VISION_RAG_TORCH_INDEX to a reachable copy of https://download.pytorch.org/whl/cpu, "
          "delete .venv and run this again")
PY
fi

if [ ${#missing_required[@]} -gt 0 ]; then
  echo "setup: ingest needs ${missing_required[*]}: install it as shown above, then run this again" >&2
  exit 1
fi
