"""How few canary tokens each kind of speculation needs: fill-ins per endpoint on fresh real llama-servers, per token count."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from specwatch.demo.llamaserver import LlamaServer, LlamaServerError
from specwatch.demo.tinymodel import write_cycle_model, write_mtp_cycle_model
from specwatch.endpoints import Endpoint
from specwatch.probe import probes
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.reasons import ProbeFailure
from specwatch.settings.targets import ServerConfig

# Every speculation type that drafts without a second model (and draft-simple, MTP), plus a plain server that must
# never show a fill-in.
KINDS: dict[str, list[str]] = {
    "plain": [],
    "draft-simple": ["-md", "{model}", "--spec-type", "draft-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
    # Needs a model with MTP heads: without --model, the cycle model's qwen35 twin with one.
    "draft-mtp": ["--spec-type", "draft-mtp"],
}
DEFAULT_KINDS = [kind for kind in KINDS if kind != "draft-mtp"]


async def first_round(url: str, tokens: int) -> dict[str, tuple[int, int | None] | str]:
    """A full canary round (every endpoint, in the daemon's order) on a server that has seen nothing yet."""
    target = ServerConfig(name="probe", url=url)
    async with new_client() as client:
        fetcher = Fetcher(client, 4 * 1024 * 1024)
        found: dict[str, tuple[int, int | None] | str] = {}
        for endpoint in Endpoint:
            try:
                tally = await probes.canary(fetcher, target, endpoint, tokens=tokens, timeout=60)
                found[endpoint.value] = (tally.fill_ins, tally.draft_n)
            except ProbeFailure as failure:
                found[endpoint.value] = str(failure)
        return found


def _first_error(text: str) -> str:
    """The server log's first error line, with the warning just before it (llama.cpp logs the cause as a warning)."""
    lines = text.splitlines()
    message = lambda line: line.split(maxsplit=2)[-1]  # noqa: E731 - "0.00.349.946 E <message>"
    for index, line in enumerate(lines):
        if " E " in line:
            cause = lines[index - 1] if index and " W " in lines[index - 1] else ""
            return "; ".join(message(part) for part in (cause, line) if part)[:200]
    return lines[0][:200] if lines else "no log"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.canary_tokens", description=__doc__)
    parser.add_argument("--tokens", default="2,3,4,6,8,12,16,24,32,48",
                        help="token counts to try (default 2,3,4,6,8,12,16,24,32,48: a chat drafts later than a completion)")
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                        help=f"server kinds to try, of {','.join(KINDS)} (default {','.join(DEFAULT_KINDS)})")
    parser.add_argument("--model", type=Path, help="a GGUF model to measure on (default: the generated cycle model; "
                                                   "draft-simple drafts with the model itself)")
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.tokens.split(",")]
    kinds = args.kinds.split(",")
    if unknown := [kind for kind in kinds if kind not in KINDS]:
        parser.error(f"unknown kind {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory(prefix="specwatch-tokens-") as tmp:
        cycle = args.model or write_cycle_model(Path(tmp) / "cycle.gguf")
        mtp = args.model or (write_mtp_cycle_model(Path(tmp) / "cycle-mtp.gguf") if "draft-mtp" in kinds else None)
        print("fill-ins / drafted (timings.draft_n) per endpoint, first canary round on a fresh server; "
              f"model {cycle.name}" + (f" (draft-mtp: {mtp.name})" if mtp and mtp != cycle else ""))
        header = f"{'kind':<14}{'tokens':>7}  " + "  ".join(f"{e.value:>24}" for e in Endpoint) + "  caught"
        print(header)
        for kind in kinds:
            extra = KINDS[kind]
            model = mtp if kind == "draft-mtp" else cycle
            for tokens in counts:
                args_for = [a.replace("{model}", str(model)) for a in extra]
                try:
                    with LlamaServer(model, args_for, log_dir=tmp) as server:
                        found = asyncio.run(first_round(server.url, tokens))
                except LlamaServerError as err:
                    # A kind this model cannot run (draft-mtp on a model without MTP layers exits 1): say why, go on.
                    print(f"{kind:<14}{'-':>7}  the server did not start: {_first_error(str(err))}", flush=True)
                    break
                cells = []
                for endpoint in Endpoint:
                    value = found[endpoint.value]
                    if isinstance(value, str):
                        cells.append(f"{value[:24]:>24}")
                    else:
                        cells.append(f"{value[0]:>3}/{tokens - 1:<3} d{value[1]!s:<5}".rjust(24))
                caught = sum(1 for v in found.values() if not isinstance(v, str) and v[0] > 0)
                print(f"{kind:<14}{tokens:>7}  " + "  ".join(cells) + f"  {caught}/{len(found)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
