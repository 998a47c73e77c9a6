"""Retake the screenshots in this folder from a built site: headless Chromium, 1280 px wide.

    make docs && python3 docs/screenshots/take.py site [NAME.png ...]

Chromium's --screenshot ignores a #fragment, so a shot of a section further down a page is taken of a
copy of the page that hides what comes before that section (the header and both sidebars stay as a
reader sees them). The copy sits beside the page, so that its links resolve, and is removed after.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name, page (under the site), id of the section to start at (None: the top), window height
SHOTS = [
    ("home.png", "", None, 1000),
    ("design.png", "design/", None, 1100),
    ("tutorial-first-job.png", "tutorials/first-job/", "run-it", 1700),
    ("tutorial-sweeps.png", "tutorials/sweeps/", None, 1500),
    ("tutorial-preemption.png", "tutorials/preemption/", "try-it-locally", 1700),
    ("tutorial-functions.png", "tutorials/functions/", None, 1600),
    ("reference-cli.png", "reference/cli/", "jaxlaunch-explain", 1300),
    ("reference-files.png", "reference/files/", None, 1500),
    ("reference-api.png", "reference/api/", None, 1300),
    ("reference-api-load-result.png", "reference/api/", "launcher.rundir.results.load_result", 1300),
    ("reference-spec.png", "reference/spec/", None, 1600),
    ("how-to-existing-programs.png", "how-to/existing-programs/", None, 1700),
    ("tutorial-before-your-big-run.png", "tutorials/before-your-big-run/", "the-tutorials-training-job", 1500),
    ("tutorial-drill-on-slurm.png", "tutorials/before-your-big-run/", "on-the-cluster-a-node-set-down-and-a-spare", 1500),
    ("design-collectives-inside-jit.png", "design/collectives/", "inside-the-jobs-own-jit", 1900),
    ("design-collectives-transports.png", "design/collectives/", "transports", 2000),
    ("how-to-debug-hang.png", "how-to/debug-hang/", "a-hang-anywhere-the-hang-watchdog-and-the-roll-call", 1700),
]
# Hides, at every level from the section up to the page's <article>, what comes before it.
HIDE_BEFORE = """<script>
addEventListener("DOMContentLoaded", () => {
  const article = document.querySelector("article");
  for (let node = document.getElementById(%r); node && node !== article; node = node.parentElement)
    for (let before = node.previousElementSibling; before; before = before.previousElementSibling)
      before.style.display = "none";
});
</script>"""


def take(site: Path, name: str, page: str, section: str | None, height: int) -> None:
    source = site / page / "index.html"
    shown = source if section is None else source.with_name(f".screenshot-{name}.html")
    if section is not None:
        shown.write_text(source.read_text().replace("</head>", HIDE_BEFORE % section + "</head>", 1))
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--window-size=1280,{height}", f"--screenshot={HERE / name}",
                        shown.as_uri()], check=True, capture_output=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
        if shown != source:
            shown.unlink()
    print(HERE / name)


if __name__ == "__main__":
    site, wanted = Path(sys.argv[1]).resolve(), set(sys.argv[2:])
    for name, page, section, height in SHOTS:
        if not wanted or name in wanted:
            take(site, name, page, section, height)
