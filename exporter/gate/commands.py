"""The `check` and `reference` commands: their parsed arguments run, the result printed, the exit code returned."""

from __future__ import annotations

import argparse
import json
import sys

from .. import loop
from ..endpoints import Endpoint
from .options import CHECK, EX_USAGE, check_server, exporter_flags_problem, logs_to_stderr, mode_problem


def check(args: argparse.Namespace) -> int:
    """`specwatch check`: a URL (or several, compared) canaried, or --exporter asked; the exit code."""
    with logs_to_stderr():
        return _checked(args)


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with how check was called, in words: the URL and --exporter exclude each other, and their flags."""
    values = vars(args)
    if args.reference is not None and args.exporters:
        return ("--reference cannot be used with --exporter: a daemon holds a group to a reference file in its config "
                "(peer_references: {GROUP: FILE})")
    if args.uniform and args.exporters:
        return ("--uniform cannot be used with --exporter: a daemon holds a group declared deployed alike in its config "
                "(peer_uniform: [GROUP])")
    if args.uniform and args.reference is not None:
        return ("--uniform cannot be used with --reference: a group held to a reference file is compared at the usual "
                "floor, the reference's deployment being nobody's declaration")
    if args.uniform and len(args.urls) < 2:
        return "--uniform compares replicas with each other: give two URLs or more"
    return mode_problem(values, url=args.urls, spelling=CHECK) or exporter_flags_problem(values, CHECK)


def _asked(args: argparse.Namespace) -> int:
    from .ask import Exporter, ask
    from .ask import render_text as render_asked

    exporters = [Exporter(url, args.exporter_username, args.exporter_password_file, args.exporter_ca_file,
                          args.exporter_cert_file, args.exporter_key_file) for url in args.exporters]
    report = loop.run(ask(exporters, servers=args.servers, labels=args.labels, model=args.model, timeout=args.timeout))
    print(json.dumps(report.as_json(), indent=2) if args.json else render_asked(report))
    return report.exit_code


def _checked(args: argparse.Namespace) -> int:
    from .check import render_text, run_check
    from .replicas import render_checks, run_checks

    problem = _usage_problem(args)
    if problem is not None:
        print(f"specwatch check: error: {problem}", file=sys.stderr)
        return EX_USAGE
    if args.exporters:
        return _asked(args)

    try:
        servers = [check_server(url, api_key_file=args.api_key_file, api_key_env=args.api_key_env, model=args.model)
                   for url in args.urls]
    except ValueError as err:
        print(f"specwatch check: {err}", file=sys.stderr)
        return EX_USAGE
    held_to = None
    if args.reference is not None:
        from ..core.reference import ReferenceFileError, read

        try:
            held_to = read(args.reference)
        except ReferenceFileError as err:
            print(f"specwatch check: --reference {err}", file=sys.stderr)
            return EX_USAGE
    endpoints = [Endpoint(e) for e in args.endpoints] if args.endpoints else list(Endpoint)
    if len(servers) > 1 or held_to is not None:
        checks = loop.run(run_checks(servers, endpoints=endpoints, tokens=args.tokens, timeout=args.timeout,
                                        load=args.load, reference=held_to, uniform=args.uniform))
        print(json.dumps(checks.as_json(), indent=2) if args.json else render_checks(checks))
        return checks.exit_code
    report = loop.run(run_check(servers[0], endpoints=endpoints, tokens=args.tokens, timeout=args.timeout,
                                   load=args.load))
    print(json.dumps(report.as_json(), indent=2) if args.json else render_text(report))
    return report.exit_code


def reference(args: argparse.Namespace) -> int:
    """`specwatch reference URL --out FILE`: a trusted server's answers recorded; the exit code."""
    from ..reasons import ProbeFailure
    from .recording import record

    if args.prompts < 1:
        print("specwatch reference: --prompts must be 1 or more", file=sys.stderr)
        return EX_USAGE
    try:
        server = check_server(args.url, api_key_file=args.api_key_file, api_key_env=args.api_key_env, model=args.model)
    except ValueError as err:
        print(f"specwatch reference: {err}", file=sys.stderr)
        return EX_USAGE
    try:
        said = loop.run(record(server, args.out, count=args.prompts, timeout=args.timeout))
    except (ProbeFailure, OSError, ValueError) as err:
        print(f"specwatch reference: nothing written: {err}", file=sys.stderr)
        return 1
    print(said)
    return 0
