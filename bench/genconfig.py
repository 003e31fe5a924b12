"""Writes a specwatch YAML config for a simulated fleet, from its manifest or from its port layout."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from tests.support.net import HOST
from tests.support.simfleet import build_config, servers_from_layout, servers_from_manifest, write_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.genconfig", description=__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--manifest", type=Path, help="the JSON manifest `tests.support.simfleet --manifest FILE` wrote")
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
