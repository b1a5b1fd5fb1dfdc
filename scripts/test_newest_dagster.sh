#!/usr/bin/env bash
# The Dagster-facing tests against the newest Dagster release on the package index, so that an
# upgrade break shows up here before the pin in pyproject.toml moves. Extra arguments go to pytest.
#
# .venv-newest is a copy of .venv (scripts/setup.sh makes that) with the newest release of each
# Dagster package the index has. Dagster releases its core (dagster, dagster-shared, dagster-pipes,
# dagster-graphql, dagster-webserver) and its libraries (dagster-postgres, -k8s, -celery, which pin
# the core release they came with) together; where the index lacks a library's or the webserver's
# matching release, the newest it has is installed beside the newest core without its pin, and
# `pip check` lists that mismatch before the tests run. A re-run with the same newest releases
# installs nothing: the versions are kept in .venv-newest/dagster-versions, with a hash of
# pyproject.toml (a change of the project's requirements copies .venv again). Without the index
# (offline), the venv that exists is used as it is.
#
# The tests: every module that imports Dagster, starts a Dagster process (dagster-daemon, dagster
# dev, dagster-webserver) or sets up a Dagster instance of its own (DAGSTER_HOME, a dagster.yaml),
# and the adapter's own test (DAGSTER_FACING below finds them, so a new module is picked up). The
# other modules run Dagster only to ingest their fixtures, through the same `vision-rag ingest`
# that test_cli and test_pipeline drive here; what they assert is parsing, OCR, embeddings,
# indexes and queries.
set -euo pipefail
cd "$(dirname "$0")/.."

CORE=(dagster dagster-shared dagster-pipes dagster-graphql)
UNPINNED=(dagster-webserver dagster-postgres dagster-k8s dagster-celery)  # pin a core release
DAGSTER_FACING='^\s*(import dagster|from dagster)|dagster-daemon|dagster-webserver|dagster dev|DAGSTER_HOME|dagster\.yaml|dagster_internals'
mapfile -t TESTS < <(grep -lE "$DAGSTER_FACING" vision_rag_pipeline_tests/test_*.py)
# VISION_RAG_DAGSTER_TESTS="test_a.py test_b.py": those modules instead (a quicker check for CI)
[ -z "${VISION_RAG_DAGSTER_TESTS:-}" ] || read -ra TESTS <<<"${VISION_RAG_DAGSTER_TESTS//test_/vision_rag_pipeline_tests/test_}"

[ -x .venv/bin/python ] || bash scripts/setup.sh
venv=.venv-newest

newest() {  # the newest release of $1 on the index, or nothing when the index cannot be reached
  .venv/bin/python -m pip index versions "$1" 2>/dev/null | sed -n '1s/^[^ ]* (\(.*\))$/\1/p'
}

wanted=()
for package in "${CORE[@]}" "${UNPINNED[@]}"; do
  version=$(newest "$package")
  [ -n "$version" ] || { wanted=(); break; }
  wanted+=("$package==$version")
done

if [ ${#wanted[@]} -eq 0 ]; then
  [ -x "$venv/bin/python" ] || { echo "the package index cannot be reached and $venv does not exist" >&2; exit 1; }
  echo "the package index cannot be reached: testing $venv as it is" >&2
elif [ "$(cat "$venv/dagster-versions" 2>/dev/null)" != "${wanted[*]} $(sha256sum <pyproject.toml)" ]; then
  echo "building $venv: ${wanted[*]}" >&2
  rm -rf "$venv.partial" "$venv"
  cp -a .venv "$venv.partial"
  "$venv.partial/bin/python" -m pip install -q "${wanted[@]:0:${#CORE[@]}}"
  "$venv.partial/bin/python" -m pip install -q --no-deps "${wanted[@]:${#CORE[@]}}"
  # a venv's scripts name their interpreter by absolute path: the copied ones and the new ones
  grep -rlIE "$PWD/(\.venv|$venv\.partial)/" "$venv.partial/bin" |
    xargs sed -i -E "s#$PWD/(\.venv|$venv\.partial)/#$PWD/$venv/#g"
  echo "${wanted[*]} $(sha256sum <pyproject.toml)" >"$venv.partial/dagster-versions"
  mv "$venv.partial" "$venv"
fi

"$venv/bin/python" -m pip check || true  # the mismatched pins, said once; not a failure
"$venv/bin/python" -c 'import dagster; print("dagster", dagster.__version__)'
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${VISION_RAG_TEST_WORKERS:-2}" --dist loadfile "${TESTS[@]}" "$@"
