# Shared by scripts/*: find a supported Python and keep a project virtualenv in .venv.
# shellcheck shell=bash
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
UV_VERSION="0.13.8"  # scripts/_env.sh installs with uv (Apache-2.0 / MIT) when it can

pick_python() {
    for candidate in "${CRAWLD_PYTHON:-}" python3.11 python3.12 python3.13 python3.14 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    # 3.15 and later: not every pinned dependency with compiled parts (msgspec, apsw, lxml,
    # selectolax, google-re2, yarl) publishes wheels for it yet.
    echo "error: crawld needs Python 3.11 to 3.14 (set CRAWLD_PYTHON to one)" >&2
    return 1
}

ensure_venv() {
    local extras="$1"
    if [ ! -x "$VENV/bin/python" ]; then
        local py
        py="$(pick_python)"
        echo "creating $VENV with $py" >&2
        "$py" -m venv "$VENV"
    fi
    local stamp="$VENV/.installed-$extras"
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        local target="$ROOT"
        [ -z "$extras" ] || target="$ROOT[$extras]"
        # uv (from PyPI, into the virtualenv) fetches and installs the pinned set in parallel: a
        # fresh clone's install takes well under a minute instead of pip's several. pip remains
        # the way when uv cannot be had. Both leave the packages' bytecode compiled (pip does by
        # default): a daemon whose user cannot write the virtualenv, or a shell that sets
        # PYTHONDONTWRITEBYTECODE, would otherwise compile every module at every start.
        if "$VENV/bin/python" -m pip install --quiet "uv==$UV_VERSION" >&2 2>/dev/null &&
            "$VENV/bin/python" -m uv pip install --quiet --compile-bytecode \
                --python "$VENV/bin/python" -e "$target" >&2; then
            :
        else
            echo "uv unavailable: installing with pip" >&2
            "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
            "$VENV/bin/python" -m pip install --quiet -e "$target" >&2
        fi
        touch "$stamp"
    fi
}
