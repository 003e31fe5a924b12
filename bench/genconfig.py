"""Writes a specwatch YAML config for a simulated fleet, from its manifest or from its port layout."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.simfleet import HOST, is_speculating, server_name


def servers_from_layout(count: int, base_port: int, host: str = HOST, spec_share: float = 0.2) -> list[dict[str, Any]]:
    """The fleet `python -m bench.simfleet --servers COUNT --base-port BASE_PORT` serves."""
    return [
        {"name": server_name(i), "url": f"http://{host}:{base_port + i}", "speculative": is_speculating(i, spec_share)}
        for i in range(count)
    ]


def servers_from_manifest(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text(encoding="utf-8"))["servers"])


def build_config(
    servers: Iterable[dict[str, Any]],
    *,
    poll_interval: str = "15s",
    canary_interval: str = "60s",
    max_concurrency: int | None = None,
    api_key_env: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A specwatch config mapping; the `kind` label says what the simulated server is, so a dashboard can check verdicts."""
    entries = []
    for server in servers:
        entry: dict[str, Any] = {
            "name": server["name"],
            "url": server["url"],
            "labels": {"pool": "sim", "kind": "speculating" if server.get("speculative") else "plain"},
        }
        if api_key_env:
            entry["api_key_env"] = api_key_env
        entries.append(entry)
    config: dict[str, Any] = {"servers": entries, "poll_interval": poll_interval, "canary_interval": canary_interval}
    if max_concurrency is not None:
        config["max_concurrency"] = max_concurrency
    config.update(extra or {})
    return config


def write_config(path: Path, config: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=200), encoding="utf-8")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.genconfig", description=__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--manifest", type=Path, help="the JSON manifest `bench.simfleet --manifest FILE` wrote")
    source.add_argument("--servers", type=int, default=100, help="fleet size, with --base-port (default 100)")
    parser.add_argument("--base-port", type=int, default=20000, help="port of the first server (default 20000)")
    parser.add_argument("--host", default=HOST, help=f"address the fleet listens on (default {HOST})")
    parser.add_argument("--spec-share", type=float, default=0.2,
                        help="share of speculating servers, for the kind label (default 0.2)")
    parser.add_argument("--poll-interval", default="15s")
    parser.add_argument("--canary-interval", default="60s")
    parser.add_argument("--max-concurrency", type=int, help="specwatch's limit on requests in flight (default: specwatch's own)")
    parser.add_argument("--api-key-env", help="environment variable holding the fleet's API key")
    parser.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.manifest is not None:
        servers = servers_from_manifest(args.manifest)
    else:
        servers = servers_from_layout(args.servers, args.base_port, args.host, args.spec_share)
    config = build_config(
        servers, poll_interval=args.poll_interval, canary_interval=args.canary_interval,
        max_concurrency=args.max_concurrency, api_key_env=args.api_key_env,
    )
    if args.output is None:
        yaml.safe_dump(config, sys.stdout, sort_keys=False, default_flow_style=None, width=200)
    else:
        write_config(args.output, config)
        print(f"wrote {args.output} ({len(config['servers'])} servers)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
