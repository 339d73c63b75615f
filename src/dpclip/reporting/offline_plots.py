"""An HTML page template for ``dvc plots show`` that renders without a network.

DVC's page loads Vega, Vega-Lite and Vega-Embed from a CDN, so offline (or behind a firewall)
it is blank. This fetches the same versions DVC's renderer names (``dvc_render``) from the npm
registry once, checks each archive against the registry's published SHA-512, and writes
``.dvc/plots/offline.html`` with the three scripts inline; ``.dvc/config.local`` then names it as
``plots.html_template``, so plain ``dvc plots show`` and ``dvc plots diff`` use it. ``make
install`` runs this; it needs the network once, like ``pip``.

    python -m dpclip.reporting.offline_plots [--project DIR]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from dpclip.errors import DpclipError
from dpclip.files import write_text

# package -> (version DVC's page loads, the file inside the npm archive, the registry's
# dist.integrity for that version)
SCRIPTS = {
    "vega": ("5.20.2", "package/build/vega.min.js",
             "sha512-qmH7aD9GGPpssVdxL1xgcdxTbQzyRUeRR16Os385ymvQhiwCYQNA6+eXUPAZDTVLfk0RXu6Jzj6kUE5j"
             "Q80EVw=="),
    "vega-lite": ("5.2.0", "package/build/vega-lite.min.js",
                  "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2J"
                  "ADOT2dhGNErw=="),
    "vega-embed": ("6.18.2", "package/build/vega-embed.min.js",
                   "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2y"
                   "dixq8Lk3dOlg=="),
}
REGISTRY = "https://registry.npmjs.org"
TEMPLATE = Path(".dvc") / "plots" / "offline.html"
CONFIG_VALUE = "plots/offline.html"  # relative to .dvc, as DVC reads it

PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>dpclip plots</title>
    <!-- Vega {vega}, Vega-Lite {vega_lite}, Vega-Embed {vega_embed} (BSD-3-Clause), inline so
         that the page renders offline. Written by `python -m dpclip.reporting.offline_plots`. -->
{scripts}
    <style>
        body {{ font-family: sans-serif; }}
        table {{ border-spacing: 15px; }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def dvc_versions() -> dict[str, str]:
    """The versions the installed ``dvc_render`` loads from its CDN (``VegaRenderer.SCRIPTS``)."""
    import re

    from dvc_render.vega import VegaRenderer

    return dict(re.findall(r"npm/([a-z-]+)@([0-9.]+)", VegaRenderer.SCRIPTS))


def check_versions() -> None:
    """Refuse when DVC's renderer moved to other versions than those pinned here: the page
    must run the Vega-Lite that DVC's templates are written for."""
    wanted = dvc_versions()
    pinned = {name: version for name, (version, _, _) in SCRIPTS.items()}
    if wanted != pinned:
        raise DpclipError(f"dvc_render loads {wanted}, dpclip.reporting.offline_plots pins "
                          f"{pinned}: update SCRIPTS (version and the registry's dist.integrity)")


def verified(data: bytes, integrity: str) -> bytes:
    """``data`` if its SHA-512 is the npm ``integrity`` string (``sha512-<base64>``)."""
    algorithm, _, expected = integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if digest != expected:
        raise DpclipError(f"downloaded archive does not match its registry {integrity!r} "
                          f"(got {algorithm}-{digest})")
    return data


def fetch_script(name: str, timeout: float = 60.0) -> str:
    version, member, integrity = SCRIPTS[name]
    url = f"{REGISTRY}/{name}/-/{name}-{version}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            archive = verified(response.read(), integrity)
    except OSError as err:
        raise DpclipError(f"cannot fetch {url}: {err}") from err
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return tar.extractfile(member).read().decode("utf-8")


def page(scripts: dict[str, str]) -> str:
    """The template: DVC fills ``{plot_divs}`` (and ``{refresh_tag}``); it has no
    ``{scripts}`` slot, so DVC's CDN tags are left out."""
    # a script's text must not close the tag that holds it
    inline = "\n".join(f"    <script>{text.replace('</script', '<' + chr(92) + '/script')}</script>"
                       for text in scripts.values())
    return PAGE.format(scripts=inline, vega=SCRIPTS["vega"][0],
                       vega_lite=SCRIPTS["vega-lite"][0], vega_embed=SCRIPTS["vega-embed"][0])


def install(project: Path = Path(".")) -> Path:
    """Write the offline page into ``project`` and name it in ``.dvc/config.local``."""
    check_versions()
    path = write_text(project / TEMPLATE, page({name: fetch_script(name) for name in SCRIPTS}))
    subprocess.run([sys.executable, "-m", "dvc", "config", "--local", "plots.html_template",
                    CONFIG_VALUE], cwd=project, check=True, capture_output=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    try:
        path = install(args.project)
    except DpclipError as err:
        print(f"dpclip.reporting.offline_plots: {err}; `dvc plots show` keeps loading Vega from "
              f"its CDN", file=sys.stderr)
        return 1
    print(f"dvc plots show now renders offline: {path} (.dvc/config.local: "
          f"plots.html_template = {CONFIG_VALUE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
