"""specwatch: catch llama-server fleets that serve fill-in logprobs under speculative decoding."""

# Imported under private names, as every name here that is not in __all__: the package's namespace is its API.
import importlib as _importlib
import typing as _typing

from .version import __version__

if _typing.TYPE_CHECKING:
    from .core.report import EndpointReport, ModelReport
    from .gate.api import aask, acheck, ask, check
    from .gate.ask import AskReport, ModelVerdict
    from .gate.check import CheckReport
    from .gate.received import AnswerTally, CannotJudge, FillInLogprobs, NotAnAnswer, Status, require_real, tally

__all__ = [
    "AnswerTally",
    "AskReport",
    "CannotJudge",
    "CheckReport",
    "EndpointReport",
    "FillInLogprobs",
    "ModelReport",
    "ModelVerdict",
    "NotAnAnswer",
    "Status",
    "__version__",
    "aask",
    "acheck",
    "ask",
    "check",
    "require_real",
    "tally",
]

# Each public name's home, imported on first use: `import specwatch` (the pytest plugin's entry point, every CLI run)
# loads no HTTP client, no daemon and no metrics library until a function or type is asked for.
_HOMES = {
    **dict.fromkeys(("aask", "acheck", "ask", "check"), "specwatch.gate.api"),
    **dict.fromkeys(("AskReport", "ModelVerdict"), "specwatch.gate.ask"),
    "CheckReport": "specwatch.gate.check",
    **dict.fromkeys(("AnswerTally", "CannotJudge", "FillInLogprobs", "NotAnAnswer", "Status", "require_real", "tally"),
                    "specwatch.gate.received"),
    **dict.fromkeys(("EndpointReport", "ModelReport"), "specwatch.core.report"),
}

# Hidden from type checkers, which read the imports above: to them a misspelt name is an error, not Any.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'specwatch' has no attribute {name!r}")
        value = getattr(_importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
