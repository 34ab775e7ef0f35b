"""What an agent's environment gains from ``pip install agl-langchain``.

Run: ``.venv/bin/python -m tests.benchmarks.bench_footprint [--package integrations/langchain]``

Builds two fresh virtual environments in a temporary directory and installs into
them from the package registry, as a user would:

- baseline: the framework alone (``langchain-core``, the integration's own dependency);
- agl: agl-core and the integration from this checkout (not editable), which is what
  ``pip install agl-langchain`` resolves to once both are published.

It prints how many distributions each holds and their size on disk, the
difference, and whether agl added anything of the training side (a web server,
rich, torch): it exits 1 if it did. It needs the package registry, like any install.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).parents[2]

# Distributions that belong to the training side and must never reach an agent's environment.
TRAINING_SIDE = {
    "uvicorn",
    "starlette",
    "rich",
    "torch",
    "uvloop",
    "httptools",
    "watchfiles",
    "websockets",
    "agl-trainer",
}


def _install(env: Path, requirements: list[str]) -> dict[str, int]:
    """Install ``requirements`` into a new venv at ``env``; return {distribution: bytes on disk}."""
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    constraint = ["-c", str(ROOT / "requirements" / "constraints.txt")]
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *constraint, *requirements], check=True
    )
    code = (
        "import json, importlib.metadata as md, os\n"
        "out = {}\n"
        "for d in md.distributions():\n"
        "    name = d.metadata['Name'].lower().replace('_', '-')\n"
        "    if name in ('pip', 'setuptools'):\n"
        "        continue\n"
        "    size = 0\n"
        "    for f in d.files or []:\n"
        "        p = d.locate_file(f)\n"
        "        size += os.path.getsize(p) if os.path.isfile(p) else 0\n"
        "    out[name] = size\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)


def _framework_requirement(package_dir: Path) -> list[str]:
    deps = tomllib.loads((package_dir / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d.split("#")[0].strip() for d in deps if not d.startswith("agl-")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="integrations/langchain", help="the integration folder to install")
    args = parser.parse_args(argv)
    package_dir = ROOT / args.package
    with tempfile.TemporaryDirectory() as tmp:
        base = _install(Path(tmp) / "base", _framework_requirement(package_dir))
        with_agl = _install(Path(tmp) / "agl", [str(ROOT / "core"), str(package_dir)])
    mib = 1024 * 1024
    added = sorted(set(with_agl) - set(base))
    print(f"{'environment':<40}{'distributions':>14}{'MiB':>10}")
    print(
        f"{'baseline: ' + ', '.join(_framework_requirement(package_dir)):<40}{len(base):>14}"
        f"{sum(base.values()) / mib:>10.1f}"
    )
    print(f"{'agl-core + ' + package_dir.name:<40}{len(with_agl):>14}{sum(with_agl.values()) / mib:>10.1f}")
    print(f"added: {len(added)} distributions, {sum(with_agl[n] for n in added) / mib:.1f} MiB: {', '.join(added)}")
    leaked = sorted(TRAINING_SIDE & set(added))
    print(f"training-side distributions agl added: {', '.join(leaked) or 'none'}")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
