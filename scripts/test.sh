#!/usr/bin/env bash
# Set up and run the tests: lint (ruff), types (mypy), then pytest. Extra args go to pytest.
# Browser tests (tests/browser) drive real JupyterLab in Debian's chromium: installed here with
# apt-get when /usr/bin/chromium is missing (as root; otherwise those tests skip).
set -euo pipefail
cd "$(dirname "$0")/.."
# The light CPU recorder compiles a small C++ library on first use (it falls back to the slower
# torch.profiler without a compiler, and a test checks it builds): install g++ where missing.
if ! command -v c++ >/dev/null && ! command -v g++ >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test.sh: installing g++ for the light recorder"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
    else
        echo "test.sh: no C++ compiler: the light recorder's build test will fail" >&2
    fi
fi
chromium_pid=""
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        mkdir -p build
        echo "test.sh: installing chromium (log: build/apt-chromium.log)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
            >build/apt-chromium.log 2>&1 &
        chromium_pid=$!
    else
        echo "test.sh: /usr/bin/chromium missing and cannot apt-get it: browser tests will skip" >&2
    fi
fi
scripts/setup.sh test
if [ -n "$chromium_pid" ] && ! wait "$chromium_pid"; then
    tail -n 20 build/apt-chromium.log >&2
    echo "test.sh: installing chromium failed" >&2
    exit 1
fi
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check jupyter_vram tests bench scripts
ruff format --check jupyter_vram tests bench scripts
mypy
# The lab extension's TypeScript unit tests (vitest, a few seconds), where Node.js is here:
# setup.sh built the extension with it, so labextension/node_modules exists.
if command -v node >/dev/null && [ -d labextension/node_modules ]; then
    (cd labextension && jlpm test)
fi
python -m pytest "$@"
