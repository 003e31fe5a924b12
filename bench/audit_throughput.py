"""`specwatch audit` on a large generated file of saved answers: throughput (MB/s) and the process' peak RSS."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.support.process import run_measured
from tests.support.saved import unit, write_repeated

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit_throughput", description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024, help="file size in MiB (default 1024)")
    parser.add_argument("--mix", choices=("chat", "mix"), default="mix",
                        help="chat: one whole chat answer per line; mix: every shape, streams and SDK dumps (default)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per answer (default 48, the check's size)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specwatch-audit-") as tmp:
        path = Path(tmp) / "answers.jsonl"
        piece = unit(args.mix, args.tokens)
        times = write_repeated(path, piece, args.size_mb << 20)
        size = path.stat().st_size
        run = run_measured("specwatch", ["audit", str(path), "--json"], cwd=ROOT, timeout=3600)
    totals = json.loads(run.stdout)["totals"]
    print(f"file: {size / 2**20:.0f} MiB, {args.mix}, {args.tokens} tokens per answer, the unit repeated {times} times")
    print(f"answers: {totals['answers']} ({totals['fill_in_answers']} with fill-ins, {totals['cannot_judge']} cannot judge, "
          f"{totals['not_answers']} not answers), exit {run.returncode}")
    print(f"time: {run.seconds:.1f} s; throughput {size / 2**20 / run.seconds:.0f} MiB/s, "
          f"{totals['answers'] / run.seconds:,.0f} answers/s")
    print(f"peak RSS of the audit process: {run.peak_rss / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
