"""The browser install (``nox -s browser``, ``.ci/install_chromium.py``) changes no installed package:
it reads apt's simulation and refuses an upgrade, a downgrade or a removal. Lines below are from
``apt-get -s install chromium`` on Debian 12 (with recommends: systemd and perl upgraded)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "install_chromium.py"
_spec = importlib.util.spec_from_file_location("install_chromium", SCRIPT)
ic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ic)

WITH_RECOMMENDS = """\
Reading package lists...
The following packages will be upgraded:
  perl systemd
2 upgraded, 3 newly installed, 0 to remove and 91 not upgraded.
Inst perl [5.36.0-7+deb12u2] (5.36.0-7+deb12u3 Debian:12.15/oldstable [amd64]) []
Inst systemd [252.38-1~deb12u1] (252.39-1~deb12u2 Debian:12.15/oldstable [amd64]) []
Inst udev (252.39-1~deb12u2 Debian:12.15/oldstable [amd64])
Inst chromium-common (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
Inst chromium (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
Conf perl (5.36.0-7+deb12u3 Debian:12.15/oldstable [amd64])
Conf chromium (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
"""

NO_RECOMMENDS = """\
0 upgraded, 3 newly installed, 0 to remove and 106 not upgraded.
Inst libogg0 (1.3.5-3 Debian:12.15/oldstable [amd64])
Inst chromium-common (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
Inst chromium (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
Conf chromium (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
"""


def test_the_install_takes_no_recommends():
    assert "--no-install-recommends" in ic.INSTALL and ic.INSTALL[-1] == "chromium"


def test_new_packages_alone_are_installed():
    new, changed, removed = ic.plan(NO_RECOMMENDS)
    assert (new, changed, removed) == (["libogg0", "chromium-common", "chromium"], [], [])
    assert ic.refusal(changed, removed) is None


def test_an_upgrade_of_an_installed_package_is_refused_by_name():
    new, changed, removed = ic.plan(WITH_RECOMMENDS)
    assert new == ["udev", "chromium-common", "chromium"] and changed == ["perl", "systemd"]
    msg = ic.refusal(changed, removed)
    assert msg.startswith("error: apt-get install -y -qq --no-install-recommends chromium would upgrade 2 installed "
                          "package(s) (perl, systemd); refusing to change installed packages.")


def test_a_removal_is_refused():
    _, changed, removed = ic.plan(NO_RECOMMENDS + "Remv chromium-bsu [1.0]\n")
    assert removed == ["chromium-bsu"] and "remove 1 (chromium-bsu)" in ic.refusal(changed, removed)
