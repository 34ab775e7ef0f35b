#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries are installed (Debian's postgresql package).
# The tests start their own throwaway cluster on 127.0.0.1 with them; nothing runs as a service.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
echo "installing PostgreSQL server binaries (apt-get install postgresql)" >&2
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
ls /usr/lib/postgresql/*/bin/initdb >/dev/null
