#!/bin/sh
# Headless Chromium for the dashboard's browser test: Debian's chromium package (playwright's own
# browser download needs the internet), and the playwright Python package that drives it.
set -e
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
fi
PYTHON="${PYTHON:-.venv/bin/python}"
if ! "$PYTHON" -c "import playwright" 2>/dev/null; then
    "$PYTHON" -m pip install -q playwright
fi
