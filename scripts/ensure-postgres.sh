#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries are installed (Debian's postgresql package).
# The tests start their own throwaway cluster on 127.0.0.1 with them (tests/pg.py);
# nothing runs as a service. Works as root and, through sudo, as any other user.
# As root, the tests run the server as the `postgres` system user that the package creates.
set -euo pipefail

have_binaries() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
have_owner() { [ "$(id -u)" -ne 0 ] || id -u postgres >/dev/null 2>&1; }

if have_binaries && have_owner; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-postgres: apt-get not found; install PostgreSQL's server (initdb, pg_ctl) under /usr/lib/postgresql/VERSION/bin by hand" >&2
  exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1 || ! sudo -n true 2>/dev/null; then
    echo "ensure-postgres: PostgreSQL is not installed and installing it needs root: run 'sudo apt-get install postgresql' (or run this script as root)" >&2
    exit 1
  fi
  SUDO=(sudo -n)
fi

echo "ensure-postgres: installing PostgreSQL server binaries (apt-get install postgresql)" >&2
APT=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq)
"${SUDO[@]}" "${APT[@]}" update
# The tests need the binaries, not a service: where no policy says otherwise, tell
# invoke-rc.d not to start the cluster the package creates (Debian's policy-rc.d
# convention, exit 101 = action forbidden), and take that policy away afterwards.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
  "${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d
  trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
fi
"${SUDO[@]}" "${APT[@]}" install -y --no-install-recommends postgresql >/dev/null

if ! have_binaries; then
  echo "ensure-postgres: postgresql installed but no /usr/lib/postgresql/*/bin/initdb found" >&2
  exit 1
fi
if ! have_owner; then
  echo "ensure-postgres: the 'postgres' system user is missing; the tests need it to run the server as root" >&2
  exit 1
fi
echo "ensure-postgres: $(ls -d /usr/lib/postgresql/*/bin | tail -1) ready" >&2
