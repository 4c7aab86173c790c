"""The fault matrix: every command × every class of bad input or broken endpoint, run for real.

Each row runs one command as a user would (a subprocess, from an empty working directory) against one
fault (a bad definition file, an HTML page, a silent port, an FTP URL, a sim wanting an API key, a
read-only ``--out``: a tmpfs mounted ro where this user may mount, else those rows are skipped) and checks
the promised end: the exit code, no traceback, nothing in the working directory, no ``--out`` left after
bad input. Usage: ``.venv/bin/python scripts/fault_matrix.py [--write docs/fault-matrix.md]``; exit 1
when a row is not ok.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.server
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fault_rows_jobs import job_rows

from engine_harness.launch import free_port

REPO = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m"]
STEP = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]
SWEEP = f"""chunks: [512]
decode_batch_sizes: [4]
prefill_tokens: [256]
repetitions: 2
decode_context: 512
engine: {{kind: sim, extra_args: {STEP}}}
"""


@dataclass
class Row:
    command: str
    fault: str
    argv: list[str]
    expect: int = 2
    out: str | None = "OUT"  # --out: OUT (the matrix's own), a path, or None; none left after an exit 2


@dataclass
class Result:
    row: Row
    code: int
    seconds: float
    traceback: bool
    stray: list[str]
    message: str

    @property
    def ok(self) -> bool:
        return self.code == self.row.expect and not self.traceback and not self.stray


class _Html(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><html><body>a router's login page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _keyed_sim() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "SIM_API_KEY": "sk-fault-matrix", "PYTHONPATH": str(REPO)}
    cmd = [*PY, "engine_harness.sim", "--model", "sim", "--port", str(port), *STEP]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the keyed sim did not start")


def _read_only(tmp: Path) -> Path | None:
    mnt = tmp / "ro"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(mnt)], capture_output=True
    )
    return mnt if done.returncode == 0 else None


def rows(tmp: Path, urls: dict[str, str], finished: Path, ro: Path | None) -> list[Row]:
    files = {
        "syntax": "chunks: [512\n  foo: : bar\n",
        "encoding": None,
        "types": "chunks: many\n",
        "escape": SWEEP + "name: ../../escape\n",
        "absolute": SWEEP + f"name: {tmp}/abs\n",
        "long-p": SWEEP.replace("prefill_tokens: [256]", "prefill_tokens: [99999999]"),
    }
    (tmp / "ok.yaml").write_text(SWEEP)
    (tmp / "transfer-escape.yaml").write_text("name: ../../escape\n")
    path = {}
    for name, text in files.items():
        path[name] = tmp / f"{name}.yaml"
        if text is None:
            path[name].write_bytes(b'chunks: "\xff\xfe latin-1, not UTF-8"\n')
        else:
            path[name].write_text(text)
    bad_manifest = tmp / "bad-manifest"
    shutil.copytree(finished, bad_manifest, ignore=shutil.ignore_patterns(".lock"))
    text = (bad_manifest / "manifest.json").read_text().replace('"repetitions": 2', '"repetitions": -3')
    (bad_manifest / "manifest.json").write_text(text)
    foreign = tmp / "foreign-version"  # a run holding a record of a schema this suite does not read
    shutil.copytree(finished, foreign, ignore=shutil.ignore_patterns(".lock"))
    record = sorted(foreign.glob("runs/*/*.json"))[0]
    record.write_text(json.dumps(json.loads(record.read_text()) | {"schema_version": 99}))
    garbage = tmp / "garbage"
    garbage.mkdir()
    (garbage / "manifest.json").write_text("{not json")
    sweep = ["microbench.sweep"]
    ext = [*sweep, "--engine", "external", "--model", "sim", "--chunk", "512", "--D", "0", "--P", "256"]
    transfer = ["microbench.transfer", "--engine", "sim", "--connector", "sim-link", "--no-alone"]
    battery = ["microbench.battery", "run", "--tests", "ttft", "--profile", "quick"]
    loadgen = [
        "microbench.loadgen",
        "run",
        "--workload",
        "synthetic-uniform",
        "--rate",
        "5",
        "--requests",
        "3",
    ]
    ablate = ["microbench.ablate", "--arm", "a=engine:max_num_seqs=8", "--arm", "b=engine:max_num_seqs=16"]
    out_rows = [
        Row("sweep", "definition: YAML syntax error", [*sweep, "--config", str(path["syntax"])]),
        Row("sweep", "definition: not UTF-8", [*sweep, "--config", str(path["encoding"])]),
        Row("sweep", "definition: wrong type", [*sweep, "--config", str(path["types"])]),
        Row("sweep", "definition: name '../../escape'", [*sweep, "--config", str(path["escape"])], out=None),
        Row("sweep", "definition: absolute name", [*sweep, "--config", str(path["absolute"])], out=None),
        Row("sweep", "P above the model's limit", [*sweep, "--config", str(path["long-p"])]),
        Row(
            "sweep",
            "chunk above the model's limit",
            [*sweep, "--engine", "sim", "--chunk", "100000", "--D", "0", "--P", "256"],
        ),
        Row(
            "sweep",
            "relative model folder that is not there",
            [*sweep, "--engine", "vllm", "--model", "./no-such-model"],
        ),
        Row(
            "sweep",
            "bad --token-range",
            [*sweep, "--config", str(tmp / "ok.yaml"), "--token-range", "300:5"],
        ),
        Row("sweep", "--resume: manifest not JSON", [*sweep, "--resume", "--out", str(garbage)], out=None),
        Row(
            "sweep",
            "--resume: manifest with a bad value",
            [*sweep, "--resume", "--out", str(bad_manifest)],
            out=None,
        ),
        Row("sweep", "--resume: no run there", [*sweep, "--resume"], out=str(tmp / "nothing")),
        Row("sweep", "external: HTML page", [*ext, "--url", urls["html"]]),
        Row("sweep", "external: silent port", [*ext, "--url", urls["silent"]]),
        Row("sweep", "external: ftp:// URL", [*ext, "--url", urls["ftp"]]),
        Row("sweep", "external: HTTP 401", [*ext, "--url", urls["keyed"]]),
        Row("transfer", "definition: YAML syntax error", [*transfer, "--config", str(path["syntax"])]),
        Row("transfer", "definition: not UTF-8", [*transfer, "--config", str(path["encoding"])]),
        Row(
            "transfer",
            "definition: name '../../escape'",
            [*transfer, "--config", str(tmp / "transfer-escape.yaml")],
        ),
        Row(
            "ablate",
            "definition: not UTF-8",
            ["microbench.ablate", "--config", str(path["encoding"])],
        ),
        Row("ablate", "sweep file: YAML syntax error", [*ablate, "--sweep", str(path["syntax"])]),
        Row("battery", "--config: not UTF-8", [*battery, "--config", str(path["encoding"])]),
        Row("battery", "--config: YAML syntax error", [*battery, "--config", str(path["syntax"])]),
        Row(
            "battery",
            "external: HTML page",
            [*battery, "--engine", "external", "--url", urls["html"]],
        ),
        Row(
            "battery",
            "external: silent port",
            [*battery, "--engine", "external", "--url", urls["silent"]],
        ),
        Row(
            "battery",
            "external: ftp:// URL",
            [*battery, "--engine", "external", "--url", urls["ftp"]],
        ),
        Row(
            "battery",
            "external: HTTP 401",
            [*battery, "--engine", "external", "--url", urls["keyed"]],
        ),
        Row("loadgen", "HTML page", [*loadgen, "--url", urls["html"]]),
        Row("loadgen", "silent port", [*loadgen, "--url", urls["silent"]]),
        Row("loadgen", "ftp:// URL", [*loadgen, "--url", urls["ftp"]]),
        Row("loadgen", "HTTP 401", [*loadgen, "--url", urls["keyed"]]),
        Row(
            "loadgen",
            "--cv -1",
            [*loadgen, "--url", urls["keyed"], "--model", "m", "--scheduler", "gamma", "--cv", "-1"],
        ),
        Row(
            "loadgen",
            "--scheduler trace without a file",
            [*loadgen, "--url", urls["keyed"], "--model", "m", "--scheduler", "trace"],
        ),
        Row(
            "loadgen",
            "workload spec: not UTF-8",
            [
                "microbench.loadgen",
                "run",
                "--workload",
                str(path["encoding"]),
                "--rate",
                "1",
                "--requests",
                "1",
                "--url",
                urls["keyed"],
                "--model",
                "m",
            ],
        ),
        Row("analysis.report", "run folder missing", ["analysis.report", str(tmp / "missing")], out=None),
        Row(
            "analysis.report",
            "folder with a garbage manifest",
            ["analysis.report", str(garbage)],
            out=str(tmp / "report-out"),
        ),
        Row(
            "analysis.report",
            "a record of an unknown schema_version",
            ["analysis.report", str(foreign)],
            out=str(tmp / "report-out"),
        ),
        Row("analysis.rederive", "run folder missing", ["analysis.rederive", str(tmp / "missing")], out=None),
        Row(
            "analysis.rederive",
            "a record of an unknown schema_version",
            ["analysis.rederive", str(foreign)],
            out=None,
        ),
        Row("analysis.rederive", "manifest not JSON", ["analysis.rederive", str(garbage)], out=None),
        Row(
            "analysis.compare",
            "run folder missing",
            ["analysis.compare", str(tmp / "missing"), str(finished)],
        ),
        Row(
            "analysis.policy",
            "run folder missing",
            ["analysis.policy", "build", str(tmp / "missing"), "--link", "seed-layerwise-50ms"],
        ),
        Row(
            "analysis.policy",
            "link profile missing",
            ["analysis.policy", "build", str(finished), "--link", str(tmp / "no-link.yaml")],
        ),
        Row("engine_harness inspect", "HTML page", ["engine_harness", "inspect", urls["html"]], out=None),
        Row("engine_harness inspect", "ftp:// URL", ["engine_harness", "inspect", urls["ftp"]], out=None),
        *(Row(**fields) for fields in job_rows(tmp, path, urls)),
    ]
    if ro is not None:
        ro_out = str(ro / "run")
        out_rows += [
            Row("sweep", "read-only --out", [*sweep, "--config", str(tmp / "ok.yaml")], out=ro_out),
            Row("transfer", "read-only --out", [*transfer, "--P", "256"], out=ro_out),
            Row("battery", "read-only --out", [*battery, "--engine", "sim"], out=ro_out),
            Row("loadgen", "read-only --out", [*loadgen, "--url", urls["keyed"], "--model", "m"], out=ro_out),
            Row("ablate", "read-only --out", [*ablate, "--sweep", str(tmp / "ok.yaml")], out=ro_out),
            Row("analysis.report", "read-only --out", ["analysis.report", str(finished)], out=ro_out),
            Row(
                "analysis.compare",
                "read-only --out",
                ["analysis.compare", str(finished), str(finished)],
                out=ro_out,
            ),
        ]
    return out_rows


def run_row(row: Row, cwd: Path) -> Result:
    if row.out == "OUT":
        row.out = str(cwd.parent / "out")
    argv = [*PY, *row.argv] + (["--out", row.out] if row.out else [])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        code, text = 124, f"timed out after 120 s: {partial}"
    seconds = time.monotonic() - t0
    stray = sorted(p.name for p in cwd.iterdir())
    if row.expect == 2 and row.out and Path(row.out).exists():
        stray.append(f"--out {row.out} created")
    for p in cwd.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if row.out and row.expect == 2 and Path(row.out).exists() and "/ro/" not in row.out:
        shutil.rmtree(row.out)
    lines = [line for line in text.splitlines() if line.strip()]
    message = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "")
    return Result(row, code, seconds, "Traceback" in text, stray, message)


def table(results: list[Result], load: str, ro: bool) -> str:
    ok = sum(r.ok for r in results)
    commands = sorted({r.row.command for r in results})
    head = [
        "# Fault matrix",
        "",
        f"Generated by `scripts/fault_matrix.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()} {os.cpu_count()} cores, load average before the run {load}. Every row ran "
        "for real (a subprocess from an empty working directory); **ok** = the promised exit code, no "
        "traceback, nothing in the working directory, no `--out` left behind for bad input.",
        "",
        f"**{len(results)} rows over {len(commands)} commands: {ok} ok, {len(results) - ok} not ok.**"
        + ("" if ro else " (Read-only rows skipped: this user may not mount a tmpfs.)"),
        "",
        "| command | fault | exit (promised) | s | outcome | message |",
        "|---|---|---|---|---|---|",
    ]
    body = []
    for r in results:
        outcome = (
            "ok"
            if r.ok
            else "**NOT OK**"
            + (" traceback" if r.traceback else "")
            + (f" wrote {', '.join(r.stray)}" if r.stray else "")
        )
        msg = r.message.replace("|", "\\|")[:160]
        body.append(
            f"| {r.row.command} | {r.row.fault} | {r.code} ({r.row.expect}) | {r.seconds:.1f} | "
            f"{outcome} | {msg} |"
        )
    return "\n".join(head + body) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    tmp = Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    html = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=html.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    keyed, keyed_url = _keyed_sim()
    ro = _read_only(tmp)
    try:
        finished = tmp / "finished"
        (tmp / "finished.yaml").write_text(SWEEP)
        subprocess.run(
            [*PY, "microbench.sweep", "--config", str(tmp / "finished.yaml"), "--out", str(finished)],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        urls = {
            "html": f"http://127.0.0.1:{html.server_address[1]}",
            "silent": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "ftp": "ftp://127.0.0.1:21",
            "keyed": keyed_url,
        }
        cwd = tmp / "cwd"
        cwd.mkdir()
        results = []
        for row in rows(tmp, urls, finished, ro):
            result = run_row(row, cwd)
            print(
                f"{'ok ' if result.ok else 'NOT'} {row.command:22} {row.fault:42} exit {result.code} "
                f"{result.seconds:5.1f} s  {result.message[:90]}",
                flush=True,
            )
            results.append(result)
    finally:
        keyed.kill()
        html.shutdown()
        silent.close()
        if ro is not None:
            subprocess.run(["umount", "-l", str(ro)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    text = table(results, load, ro is not None)
    if args.write:
        args.write.write_text(text)
    print(text.split("\n\n")[2])
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
