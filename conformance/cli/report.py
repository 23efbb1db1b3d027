"""The ``report`` command: render the static HTML report of an opdb database."""

from __future__ import annotations

from pathlib import Path

import click

from opdb import OpdbError, Store

from . import UsageProblem, db_option, handles_errors, main


@main.command("report")
@db_option()
@click.option("--build", "builds", multiple=True, metavar="NAME",
              help="Render only this build (repeatable; default: every build in the DB).")
@click.option("--out", "out_dir", default="site", show_default=True, type=click.Path(file_okay=False),
              help="Folder to write the site into (created if missing; replaced whole if it holds a previous report).")
@click.option("-j", "--jobs", type=click.IntRange(0, 64), default=1, show_default=True,
              help="Render builds in this many processes (0: one per CPU, at most 4).")
@handles_errors
def report_cmd(db_path: str, builds: tuple[str, ...], out_dir: str, jobs: int | None) -> None:
    """Render a static HTML site (one folder per build, an index of builds) from --db.

    The site is self-contained and works from file:// offline. For each build it shows the
    latest finished op run and model run: summary, op x dtype matrix, one page per op, models,
    and the diff against the previous build.

    Example: conformance report --db results/opdb.sqlite --out site && xdg-open site/index.html
    """
    from conformance.triage.upstream import known_by_target
    from reports import UnknownBuild, publish_site
    from reports.site import check_site_dir

    out = Path(out_dir)
    check_site_dir(out)  # before the database is opened: a refused folder is left as it is
    with Store.open(db_path, create=False) as st:
        try:
            result = publish_site(st, out, builds=list(builds), db_label=db_path, jobs=jobs or None,
                                  upstream=known_by_target())
        except UnknownBuild as exc:
            raise UsageProblem(str(exc)) from None
        except OSError as exc:
            raise OpdbError(f"{out}: cannot write the site ({exc.strerror or exc})") from None
    if not result.builds:
        click.echo(f"no runs in {db_path} yet; wrote an empty index to {out / 'index.html'}")
        return
    click.echo(f"wrote {result.pages} pages ({result.bytes / 1e6:.1f} MB) for {len(result.builds)} "
               f"build(s) to {out} in {result.seconds:.2f} s; open {out / 'index.html'}")
