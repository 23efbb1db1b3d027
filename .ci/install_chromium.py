"""Install Debian's chromium for the browser tests, and change nothing else on the machine.

Plain ``apt-get install chromium`` on a Debian 12 machine installed 116 packages and upgraded 15
installed ones (systemd, udev, perl among them): chromium's Recommends pull in udev and avahi,
and apt upgrades an installed package when a new one needs a newer version of it (``--no-upgrade``
only applies to the packages named on the command line). So this installs with
``--no-install-recommends`` (25 packages there, none upgraded) after asking apt's simulation
(``apt-get -s``) what it would do: if that would upgrade, downgrade or remove any installed
package, it refuses, lists them, and installs nothing.

Usage (as root): ``python3 .ci/install_chromium.py [--dry-run]`` (``nox -s browser`` runs it).
``--dry-run`` prints the plan and changes nothing (it skips ``apt-get update`` too).
Exit 0: chromium is at /usr/bin/chromium (already, or installed now; with --dry-run: it could
be installed); 2: refused, or it cannot (no apt-get, not root, apt failed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
INSTALL = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]
_INST = re.compile(r"Inst (\S+) (\[[^\]]*\] )?\(")  # "Inst pkg [installed version] (new version ...)"


def plan(simulation: str) -> tuple[list[str], list[str], list[str]]:
    """(new, changed, removed) packages in the output of ``apt-get -s install``: a package apt
    would install fresh, one whose installed version it would replace, one it would remove."""
    new: list[str] = []
    changed: list[str] = []
    removed: list[str] = []
    for line in simulation.splitlines():
        m = _INST.match(line)
        if m:
            (changed if m.group(2) else new).append(m.group(1))
        elif line.startswith("Remv "):
            removed.append(line.split()[1])
    return new, changed, removed


def refusal(changed: list[str], removed: list[str]) -> str | None:
    """The one error line when the install would touch installed packages, else None."""
    if not changed and not removed:
        return None
    parts = ([f"upgrade {len(changed)} installed package(s) ({', '.join(changed)})"] if changed else []) + (
        [f"remove {len(removed)} ({', '.join(removed)})"] if removed else [])
    return (f"error: {' '.join(INSTALL)} would {' and '.join(parts)}; refusing to change installed packages. "
            f"Install chromium yourself (so that {CHROMIUM} exists) and run the tests again.")


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    if CHROMIUM.exists():
        print(f"{CHROMIUM} is installed; nothing to do")
        return 0
    if shutil.which("apt-get") is None:
        print(f"error: {CHROMIUM} is missing and there is no apt-get; install chromium by other means",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0 and not dry:
        print(f"error: {CHROMIUM} is missing; installing it needs root "
              f"(sudo python3 {Path(__file__).as_posix()}, or: sudo {' '.join(INSTALL)})", file=sys.stderr)
        return 2
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not dry:  # package lists only: `apt-get update` installs and upgrades nothing
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    sim = subprocess.run(["apt-get", "-s", *INSTALL[1:]], capture_output=True, text=True, env=env)
    if sim.returncode != 0:
        print(f"error: apt-get -s {' '.join(INSTALL[1:])} failed: {sim.stderr.strip()}", file=sys.stderr)
        return 2
    new, changed, removed = plan(sim.stdout)
    why_not = refusal(changed, removed)
    if why_not:
        print(why_not, file=sys.stderr)
        return 2
    print(f"{'would install' if dry else 'installing'} Debian's chromium for the browser tests: {len(new)} new "
          f"package(s) ({', '.join(new)}); no installed package upgraded or removed")
    if dry:
        return 0
    subprocess.run(INSTALL, check=True, env=env)
    if not CHROMIUM.exists():
        print(f"error: {' '.join(INSTALL)} succeeded but {CHROMIUM} is missing", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
