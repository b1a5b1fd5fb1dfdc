#!/usr/bin/env bash
# Set up everything vision_rag_pipeline needs, idempotently: Tesseract (Debian packages), a
# virtual environment in .venv with the CPU build of torch first, then the project with its dev
# extras. A second run takes a few seconds: it only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "setup: need root (or sudo) for: $*" >&2; return 1; fi; }
apt_updated=""
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Tesseract with the common OCR languages (media_enrichment.ocr.languages picks among them) and
# fonts for the generated Chinese/Russian test pages; only what is missing is installed.
OCR_LANGUAGES="eng chi_sim chi_tra rus ukr deu fra spa ita por jpn kor"
missing=()
command -v tesseract >/dev/null || missing+=(tesseract-ocr)
have=$(tesseract --list-langs 2>/dev/null || true)
for lang in $OCR_LANGUAGES; do
  grep -qx "$lang" <<<"$have" || missing+=("tesseract-ocr-${lang//_/-}")
done
fc-list 2>/dev/null | grep -q NotoSansCJK || missing+=(fonts-noto-cjk)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  apt_install "${missing[@]}"
fi

# Redis, the Celery broker of the multi-host test (test_multihost.py starts its own server).
command -v redis-server >/dev/null || apt_install redis-server

# Headless Chromium for the UI test (marked `browser`; it skips without it).
if ! command -v chromium >/dev/null && [ "${VISION_RAG_SKIP_BROWSER:-}" != 1 ]; then
  echo "setup: installing chromium (for the browser test; VISION_RAG_SKIP_BROWSER=1 skips)" >&2
  apt_install chromium || echo "setup: chromium not installed; the browser test will be skipped" >&2
fi

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PYTHON" >&2
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    apt_install python3-venv
    "$PYTHON" -m venv .venv
  fi
fi

# Reinstall only when the dependency list changed since the last successful install.
stamp=.venv/.vision_rag_installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first time: a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned to the CPU build, so sentence-transformers does not pull a CUDA build.
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
