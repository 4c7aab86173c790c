"""Render HTML reports in headless Chromium to PNG, and say what runs off the page.

    python scripts/render_reports.py results/battery-1/report.html results/run-1/report.html --out DIR

For each report, two passes of Debian's ``chromium`` (``apt-get install chromium``): the first loads a
copy with a small script appended that measures the page (its full height, and every element wider
than the viewport that is not inside a horizontally scrolling box) and dumps the DOM; the second takes a
full-height screenshot at that size. The PNG is also cut into ``-partNN.png`` tiles of at most 1600 px
so each can be looked at whole. Exit status 1 when any page overflows (the offending elements are
printed), 2 when Chromium is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
MEASURE = """<script>
(() => {
  const w = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('.scroll')) continue;
    const r = el.getBoundingClientRect();
    const spills = el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0 &&
                   getComputedStyle(el).overflowX === 'visible';
    if (r.right > w + 1 || spills) {
      wide.push(el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') + ' box right=' +
                Math.round(r.right) + ' content width=' + el.scrollWidth + ' of ' + el.clientWidth +
                ' text=' + (el.textContent || '').trim().slice(0, 60));
    }
  }
  const doc = document.documentElement;
  if (doc.scrollWidth > w + 1) wide.unshift('the page itself: ' + doc.scrollWidth + ' px wide in ' + w);
  const out = {height: doc.scrollHeight, width: w, overflow: wide.slice(0, 20)};
  document.body.setAttribute('data-measure', JSON.stringify(out));
})();
</script>"""
TILE = 1600


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise SystemExit(2)


def _run(args: list[str], profile: str) -> str:
    cmd = [_chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-500:]}")
    return done.stdout


def measure(page: Path, width: int, scratch: Path, profile: str) -> dict[str, object]:
    """Full height and the elements wider than the viewport of ``page`` rendered ``width`` px wide."""
    copy = scratch / f"measure-{page.stem}.html"
    text = page.read_text()
    copy.write_text(text.replace("</body>", MEASURE + "</body>") if "</body>" in text else text + MEASURE)
    dom = _run([f"--window-size={width},1000", "--dump-dom", copy.as_uri()], profile)
    found = re.search(r"data-measure=\"([^\"]*)\"", dom)
    if found is None:
        raise RuntimeError(f"{page}: the measuring script did not run")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(page: Path, png: Path, width: int, height: int, profile: str) -> list[Path]:
    """A full-page PNG of ``page`` and its tiles."""
    _run([f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()], profile)
    tiles = []
    with Image.open(png) as image:
        for i, top in enumerate(range(0, image.height, TILE)):
            tile = png.with_name(f"{png.stem}-part{i:02d}.png")
            image.crop((0, top, image.width, min(top + TILE, image.height))).save(tile)
            tiles.append(tile)
    return tiles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="+", type=Path, help="HTML report files")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs (created)")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in px (default 1280)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.pages if not p.is_file()]
    if missing:
        print(f"no such report: {', '.join(missing)}", file=sys.stderr)
        return 2
    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        print("Chromium not found: apt-get update && apt-get install chromium", file=sys.stderr)
        return 2
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    with tempfile.TemporaryDirectory(dir=args.out) as scratch, tempfile.TemporaryDirectory() as profile:
        for i, page in enumerate(args.pages):
            info = measure(page, args.width, Path(scratch), profile)
            png = args.out / f"{i:02d}-{page.parent.name}-{page.stem}.png"
            tiles = screenshot(page, png, args.width, int(info["height"]) + 20, profile)  # type: ignore[call-overload]
            overflow = info["overflow"]
            print(
                f"{page}: {info['height']} px tall, {len(tiles)} tiles in {args.out}; "
                f"{'OVERFLOW' if overflow else 'no overflow'}"
            )
            for line in overflow:  # type: ignore[attr-defined]
                print(f"  wider than the page: {line}")
            failed |= bool(overflow)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
