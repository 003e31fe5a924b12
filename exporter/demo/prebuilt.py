"""llama-server build 11549 from the prebuilt xllamacpp wheel, started with llama-server's own flags: python -m this.

xllamacpp runs llama-server's HTTP server inside a Python process. This module gives it llama-server's command line (the
flags the demo and the tests pass; any other is refused by name), so a prebuilt server starts, logs and stops as a
compiled llama-server does, in a process of its own: SIGTERM or SIGINT end it once its model is loaded (while it loads,
neither does, as with llama-server). Exit codes: 1 the server did not start, 2 a flag it does not take, 3 the wheel is
not installed or cannot load on this machine.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ..settings.targets import LLAMA_SERVER_PORT as DEFAULT_PORT
from .llamaserver import CANNOT_LOAD, PACKAGE, REQUIREMENT
from .llamaserver import PREBUILT_BUILD as BUILD

SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
"""--spec-type's values on this build, as llama-server spells them."""
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class _LauncherParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (this launcher takes the llama-server flags listed by --help)\n")


def parser() -> argparse.ArgumentParser:
    """llama-server's flags that a prebuilt server honours here, spelt as llama-server spells them."""
    p = _LauncherParser(prog="python -m specwatch.demo.prebuilt", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("-m", "--model", required=True, help="the GGUF model file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}, as llama-server from b11521")
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("-t", "--threads", type=int, default=-1)
    p.add_argument("-tb", "--threads-batch", type=int, default=-1)
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-a", "--alias", action="append", default=[])
    p.add_argument("--api-key", action="append", default=[])
    p.add_argument("-md", "--model-draft", help="the draft model's GGUF file")
    p.add_argument("--spec-type", default="none", help=f"comma-separated, of: {', '.join(SPEC_TYPES)}")
    p.add_argument("--spec-draft-sampling", choices=("greedy", "probabilistic"), default="greedy")
    p.add_argument("--spec-ngram-simple-size-n", type=int, help="ngram-simple's lookup n-gram length (1 to 1024)")
    p.add_argument("--spec-synth-len", type=float)
    p.add_argument("--spec-synth-rates")
    p.add_argument("-ctk", "--cache-type-k", choices=KV_TYPES, default="f16")
    p.add_argument("-ctv", "--cache-type-v", choices=KV_TYPES, default="f16")
    p.add_argument("--slots", dest="slots", action="store_true", default=True)
    p.add_argument("--no-slots", dest="slots", action="store_false")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--sleep-idle-seconds", type=int, default=-1)
    p.add_argument("--seed", type=int)
    return p


def params(args: argparse.Namespace, xllamacpp: Any) -> Any:
    """The wheel's CommonParams for these flags."""
    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.hostnames = [args.host]
    p.port = args.port
    p.n_ctx = args.ctx_size
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads_batch if args.threads_batch > 0 else args.threads
    p.n_parallel = args.parallel
    p.n_batch, p.n_ubatch = args.batch_size, args.ubatch_size
    if args.alias:
        p.model_alias = args.alias
    p.api_keys = args.api_key
    p.endpoint_slots = args.slots
    p.endpoint_metrics = args.metrics
    p.sleep_idle_seconds = args.sleep_idle_seconds
    p.cache_type_k = _kv_type(xllamacpp, args.cache_type_k)
    p.cache_type_v = _kv_type(xllamacpp, args.cache_type_v)
    if args.seed is not None:
        p.sampling.seed = args.seed
    types = [t.strip() for t in args.spec_type.split(",") if t.strip()]
    unknown = [t for t in types if t not in SPEC_TYPES]
    if unknown:
        raise ValueError(f"--spec-type {','.join(unknown)}: not a speculation type of {BUILD}; one of {', '.join(SPEC_TYPES)}")
    kinds = xllamacpp.common_speculative_type
    # llama-server adds the types given to its default list, ["none"]: /slots then reads "none,draft-simple".
    p.speculative.types = [getattr(kinds, "COMMON_SPECULATIVE_TYPE_" + t.upper().replace("-", "_")) for t in ["none", *types]]
    if args.model_draft:
        p.speculative.draft.mparams.path = args.model_draft
    p.speculative.draft.probabilistic = args.spec_draft_sampling == "probabilistic"
    if args.spec_ngram_simple_size_n is not None:
        if not 1 <= args.spec_ngram_simple_size_n <= 1024:
            raise ValueError("--spec-ngram-simple-size-n: ngram size N must be between 1 and 1024 inclusive")
        p.speculative.ngram_simple.size_n = args.spec_ngram_simple_size_n
    if args.spec_synth_len is not None:
        p.speculative.synth_len = args.spec_synth_len
    if args.spec_synth_rates:
        p.speculative.synth_rates = [float(r) for r in args.spec_synth_rates.split(",")]
    return p


def _kv_type(xllamacpp: Any, name: str) -> Any:
    return getattr(xllamacpp.ggml_type, "GGML_TYPE_" + name.upper())


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        import xllamacpp
    except ImportError as err:
        print(f"llama-server {BUILD} prebuilt: the {PACKAGE} wheel is not installed or cannot load here ({err}); "
              f"pip install '{REQUIREMENT}'", file=sys.stderr)
        return CANNOT_LOAD
    except OSError as err:  # a shared object the wheel links that this system lacks
        print(f"llama-server {BUILD} prebuilt: the {PACKAGE} wheel cannot load on this machine ({err})", file=sys.stderr)
        return CANNOT_LOAD
    try:
        wanted = params(args, xllamacpp)
    except ValueError as err:
        print(f"llama-server {BUILD} prebuilt: {err}", file=sys.stderr)
        return 2
    # SIGTERM and SIGINT end the process as they end llama-server: no handler of ours, which would have to wait for the
    # wheel, which holds the interpreter while it loads a model.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, signal.SIG_DFL)
    try:
        server = xllamacpp.Server(wanted)
    except (ValueError, RuntimeError) as err:
        print(f"llama-server {BUILD} prebuilt: did not start: {err}", file=sys.stderr)
        return 1
    print(f"llama-server {BUILD} prebuilt (xllamacpp) listening at {server.listening_address}", file=sys.stderr, flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
