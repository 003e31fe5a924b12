"""Write specwatch's Prometheus rules, alerts/specwatch.rules.yml, from one config: job selector, replica labels, runbooks."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

HERE = Path(__file__).resolve().parent
TARGET = HERE / "specwatch.rules.yml"
WIDTH = 120

# Where docs/runbooks.md is published; each alert links to its section, whose GitHub anchor is its name in lower case.
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/specwatch/specwatch/blob/main/docs/runbooks.md"
# specwatch's own scrape targets, for the alerts about targets that are down (examples/prometheus.yml, the ServiceMonitor).
DEFAULT_JOB_SELECTOR = 'job="specwatch"'
# The target labels in which replicas watching the same servers differ (docs/sharding.md): per-server rules drop them.
DEFAULT_AGGREGATE_AWAY = ("instance", "pod")
# The scrape job of llama-server's own /metrics in examples/prometheus.yml, read by the dashboards' llama_job variable.
LLAMA_SERVER_JOB = "llama-server"
# Every alert's name starts with it; the dashboards list the firing ones by it.
ALERT_PREFIX = "Specwatch"
# The longest absence of an exporter's series the alerts ride through: a restart or a replica rolled (the series go
# stale, then come back once the new process has polled and canaried, seconds later). The page keeps firing that long
# (keep_firing_for); the tickets read the exporter's series through last_over_time over it, so their `for:` runs on
# across the gap instead of starting again, and a firing ticket does not resolve in it.
RESTART_BRIDGE = "5m"


class Recorded:
    """The recording rules' names: the rules below define them, the dashboards read them."""

    VERDICTS = "job_verdict:specwatch_verdict:sum"
    SERVING_FILL_INS = "job:specwatch_serving_placeholders:sum"
    SERVING_FILL_INS_SHARE = "job:specwatch_serving_placeholders:avg"
    FILL_IN_TOKEN_RATIO = "job_endpoint:specwatch_canary_placeholder_tokens:ratio"
    CANARY_TOKENS_PER_HOUR = "job:specwatch_canary_generated_tokens:rate1h"
    DRAFTED_RATE = "server_model:llamacpp_drafted_tokens:rate5m"
    GENERATED_RATE = "server_model:llamacpp_generated_tokens:rate5m"
    DRAFTED_SHARE = "server_model:llamacpp_drafted_tokens:ratio_rate5m"
    FINGERPRINT_CONTENT = "server_model_field:specwatch_model_fingerprint_info:content"
    FINGERPRINT_SERVERS = "job_peer_group_field_value:specwatch_model_fingerprint_info:count"
    FIELD_SERVERS = "job_peer_group_field:specwatch_model_fingerprint_info:count"
    FLEET_FINGERPRINT_AGREEMENT = "server_model:specwatch_peer_fingerprint_agreement:fleet"


# A fleet flips at once when an upgrade turns speculative decoding on for every server of a build (llama.cpp PR #28391:
# ngram-mod on by default): every server of that build serves fill-ins, while a server misconfigured by hand is one
# among its build's clean peers. A flip is told per build the servers report and per pool (the static `pool` label;
# servers without one are one pool), and needs both: FLIP_SERVERS of them, so a small pool's coincidence still pages
# per server with its endpoints named; and FLIP_SHARE of the build's servers with a verdict, so one bad server in a big
# fleet of that build stays its own incident. In a wave of hundreds within a canary interval the first FLIP_SERVERS are
# proven within seconds, inside the per-server page's group_wait, so their pages are inhibited too.
FLIP_BY = ("job", "pool", "build")
FLIP_SERVERS = 5
FLIP_SHARE = 0.5

# The labels of specwatch_model_fingerprint_info that say what a model file holds (/v1/models' meta): another value is
# another model. The fleet-wide comparison compares them field by field, as the exporter does: a field a server does
# not report ("", so no label: a router's models have no meta, a new process is not asked yet) is not held against it.
FINGERPRINT = ("ftype", "size", "n_params", "n_vocab", "n_ctx_train", "n_embd")
# Its labels that say how the file was deployed (/props' build, the file's name): never compared, so a rolling upgrade
# of llama.cpp across a pool, or the same weights under another file name, is never a disagreement.
DEPLOYMENT = ("build", "file")
# The label the fleet-wide comparison names a content field by, beside the field's own label holding its value.
FIELD = "field"
# How long a peer group must have a member that differs before a ticket is filed. The exporter says a member differs at
# once when its file's content differs, and when the sequential test over its peer-probe answers decides (never on one
# answer); this is the second guard: a pool rolled onto another file replica by replica differs for the minutes the
# rollout takes, and a test that decides on a run of unlucky answers is worn down again by the next ones.
PEER_FOR = "10m"
# The peer probe asks a member one question per canary_interval (60s by default) on every replica watching it. A member
# none of whose probes succeeded on any replica in PROBE_WINDOW, with failures counted, files a ticket after PROBE_FOR
# more: an established member has then failed for 30 minutes (some 30 questions on each replica), longer than a
# restart, a load spike or a slow model's timeouts last; a member new to its group, with no success behind it, for its
# first 10 minutes. A ticket: the fill-in canary goes on, only the comparison of answers waits.
PROBE_WINDOW = "20m"
PROBE_FOR = "10m"

# Labels the rules group and match by: aggregating one of them away would merge what the alerts tell apart.
KEPT_LABELS = frozenset({"job", "server", "model", "endpoint", "verdict", "peer_group", FIELD})
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = r'[ ]*[a-zA-Z_][a-zA-Z0-9_]*[ ]*(?:=~|!~|!=|=)[ ]*"(?:[^"\\\n]|\\[^\n])*"[ ]*'
_SELECTOR = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?[ ]*")


class ConfigError(ValueError):
    """Every problem of a rules config, one per line."""


@dataclass(frozen=True)
class RulesConfig:
    job_selector: str = DEFAULT_JOB_SELECTOR
    aggregate_away: tuple[str, ...] = DEFAULT_AGGREGATE_AWAY
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL

    def __post_init__(self) -> None:
        problems = [*_selector_problems(self.job_selector), *_label_problems(self.aggregate_away),
                    *_url_problems(self.runbook_base_url)]
        if problems:
            raise ConfigError("\n".join(problems))

    def without(self, *more: str) -> str:
        """The grouping clause of a per-server rule: one series per server, however many replicas watch it."""
        return f"without ({', '.join(sorted({*self.aggregate_away, *more}))})"

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_base_url}#{alert.lower()}"

    def flags(self) -> list[str]:
        """The command-line flags that give this config (none for the defaults)."""
        given = []
        if self.job_selector != DEFAULT_JOB_SELECTOR:
            given += ["--job-selector", self.job_selector]
        if self.aggregate_away != DEFAULT_AGGREGATE_AWAY:
            given += ["--aggregate-away", ",".join(self.aggregate_away)]
        if self.runbook_base_url != DEFAULT_RUNBOOK_BASE_URL:
            given += ["--runbook-base-url", self.runbook_base_url]
        return given


def _selector_problems(selector: str) -> list[str]:
    if _SELECTOR.fullmatch(selector):
        return []
    hint = " (without the braces)" if selector.strip().startswith("{") else ""
    return [f"--job-selector {selector!r}: give label matchers{hint} such as job=\"specwatch\" or "
            'job=~"specwatch|specwatch-b", each value in double quotes']


def _label_problems(labels: tuple[str, ...]) -> list[str]:
    if not labels:
        return ["--aggregate-away: name at least the label replicas differ in (instance, the target's address)"]
    problems = []
    for label in labels:
        if not _LABEL.fullmatch(label) or label.startswith("__"):
            problems.append(f"--aggregate-away {label!r}: not a label name (letters, digits and _, not starting with __)")
        elif label in KEPT_LABELS:
            problems.append(f"--aggregate-away {label!r}: the rules group and match by it, so it must stay "
                            f"(kept: {', '.join(sorted(KEPT_LABELS))})")
    if len(set(labels)) != len(labels):
        problems.append(f"--aggregate-away {','.join(labels)!r}: a label is named twice")
    return problems


def _url_problems(url: str) -> list[str]:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc or any(c.isspace() or c in "\"'<>" for c in url):
        return [f"--runbook-base-url {url!r}: give the http(s) address of your copy of docs/runbooks.md"]
    if "#" in url:
        return [f"--runbook-base-url {url!r}: leave out the #fragment: each alert's anchor (its name in lower case) is added"]
    return []


# --- the rules ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    name: str
    expr: str
    note: str


@dataclass(frozen=True)
class Alert:
    name: str
    note: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str | None = None
    keep_firing_for: str | None = None


def recording(c: RulesConfig) -> list[Record]:
    return [
        Record(Recorded.VERDICTS, f"sum by (job, verdict) (max {c.without()} (specwatch_verdict))",
               "Servers (router models count one each) per verdict (clean, fill_ins, unproven, unchecked), per scrape job."),
        Record(Recorded.SERVING_FILL_INS, f"sum by (job) (max {c.without()} (specwatch_serving_placeholders))",
               "Servers whose last successful canary found fill-in logprobs, per scrape job (0 when none)."),
        Record(Recorded.SERVING_FILL_INS_SHARE, f"avg by (job) (max {c.without()} (specwatch_serving_placeholders))",
               "Share of the servers with a canary verdict that serve fill-ins (0 to 1)."),
        Record(Recorded.FILL_IN_TOKEN_RATIO,
               f"sum by (job, endpoint) (max {c.without()} (specwatch_canary_placeholder_tokens))\n"
               "  /\n"
               f"sum by (job, endpoint) (max {c.without()} (specwatch_canary_tokens))",
               "Fleet-wide fill-in fraction: fill-ins among the canary tokens judged (those after the first), per endpoint; "
               "1 when every judged token is a fill-in."),
        Record(Recorded.CANARY_TOKENS_PER_HOUR, "sum by (job) (rate(specwatch_canary_generated_tokens_total[1h])) * 3600",
               "What watching costs: canary tokens the servers generated per hour, fleet-wide (all replicas count: each asks)."),
    ]


def _content(c: RulesConfig) -> str:
    """Each member's value of each content field it reports: one series per field, named by FIELD, the value in the
    field's own label; once however many replicas report it (two during a change), held over an exporter's restart. A
    server outside every group (peer_group: none) has an empty peer_group and is compared with nothing."""
    chunks = []
    for name in FINGERPRINT:
        others = [label for label in (*DEPLOYMENT, *FINGERPRINT) if label != name]
        reported = _held(f'specwatch_model_fingerprint_info{{peer_group!="", {name}!=""}}')
        chunks.append(f'max {c.without(*others)} (\n  label_replace({reported}, "{FIELD}", "{name}", "", "")\n)')
    return "\nor\n".join(chunks)


def peers(c: RulesConfig) -> list[Record]:
    group, each = "job, peer_group", ", ".join(FINGERPRINT)
    return [
        Record(Recorded.FINGERPRINT_CONTENT, _content(c),
               "Fleet-wide, across shards: what each member of a peer group (a server, or a router's model) says its "
               f"model file holds, one series per content field it reports ({FIELD}: its name; the field's own label: "
               "its value). The build and the file's name are dropped: they say how the file was deployed, not what it "
               "holds."),
        Record(Recorded.FINGERPRINT_SERVERS, f"count by ({group}, {FIELD}, {each}) ({Recorded.FINGERPRINT_CONTENT})",
               "The members of each peer group that report each value of each content field."),
        Record(Recorded.FIELD_SERVERS,
               f"count by ({group}, {FIELD}) (\n  count by ({group}, {FIELD}, server, model) ({Recorded.FINGERPRINT_CONTENT})\n)",
               "The members of each peer group that report each content field, each counted once: a server an HA pair "
               "reports twice, even with two values while it changes, is one member and never held against itself."),
        Record(Recorded.FLEET_FINGERPRINT_AGREEMENT,
               f"min {c.without(FIELD)} (\n"
               f"  max {c.without(*FINGERPRINT)} (\n"
               f"    {Recorded.FINGERPRINT_CONTENT}\n"
               f"      * on ({group}, {FIELD}, {each}) group_left ()\n"
               f"    (\n      {Recorded.FINGERPRINT_SERVERS} * 2\n        > bool on ({group}, {FIELD}) group_left ()\n"
               f"      {Recorded.FIELD_SERVERS}\n    )\n"
               "  )\n"
               f"  and on ({group}, {FIELD}) ({Recorded.FIELD_SERVERS} > 1)\n"
               ")",
               "Per member of a peer group, across every exporter and shard: 1 when its value of every content field "
               "that two or more members report is the group's strict majority, 0 when one is not (in a group of two "
               "that differ, both; in a split, every member). The exporters' own specwatch_peer_agreement compares "
               "the content and the answers to the peer probe, but only among the servers one exporter watches."),
    ]


def llama_server(c: RulesConfig) -> list[Record]:
    return [
        Record(Recorded.DRAFTED_RATE,
               'sum by (job, server, model) (rate({__name__="llamacpp:spec_decode_num_accepted_tokens_total"}[5m]))',
               f"llama-server's own counters (scraped with --metrics through the /sd targets specwatch serves, job "
               f'"{LLAMA_SERVER_JOB}" in examples/prometheus.yml): the tokens a server drafted, i.e. generated through its '
               "speculative path. Their logprobs are fill-ins whenever a client asks for logprobs."),
        Record(Recorded.GENERATED_RATE, 'sum by (job, server, model) (rate({__name__="llamacpp:tokens_predicted_total"}[5m]))',
               ""),
        Record(Recorded.DRAFTED_SHARE, f"{Recorded.DRAFTED_RATE}\n  /\n({Recorded.GENERATED_RATE} > 0)",
               "Share of the generated tokens that were drafted (0 to 1); absent while a server generates nothing."),
    ]


def _held(selector: str) -> str:
    """The series' last sample within RESTART_BRIDGE: what an exporter said before a restart holds until it speaks again."""
    return f"last_over_time({selector}[{RESTART_BRIDGE}])"


# Router models the router has not loaded are never probed, so no alert about probing them fires.
def _loaded(c: RulesConfig) -> str:
    return f"unless on (job, server, model) max {c.without()} ({_held('specwatch_model_loaded')}) == 0"


_MODEL = "{{ with $labels.model }} (model {{ . }}){{ end }}"
# The endpoints whose last canary found fill-ins, read at the alert's evaluation: on a build that fixes the speculative
# path but for post_sampling_probs, on-call learns that only that endpoint is affected.
_ENDPOINTS = (
    '{{ with printf "max by (endpoint) (specwatch_canary_placeholder_tokens{job=%q, server=%q, model=%q} > 0)" '
    "$labels.job $labels.server $labels.model | query }} Endpoints serving them: "
    '{{ range $i, $s := sortByLabel "endpoint" . }}{{ if $i }}, {{ end }}{{ $s.Labels.endpoint }}{{ end }}.{{ end }}'
)
# The alert fires on the first proof, while the round of every endpoint after a restart or change may still run, and
# Alertmanager does not send the page again when the list grows: the endpoints no replica has canaried since are named
# as such, so a page never reads as "only these endpoints" when the others are merely not yet known.
_PENDING = (
    '{{ with printf "max by (endpoint) (specwatch_canary_checked{job=%q, server=%q, model=%q}) == 0" '
    "$labels.job $labels.server $labels.model | query }} Not yet canaried since the server started or changed, so "
    'count them as serving fill-ins too: {{ range $i, $s := sortByLabel "endpoint" . }}{{ if $i }}, {{ end }}'
    "{{ $s.Labels.endpoint }}{{ end }}.{{ end }}"
)


def _fill_ins_by_build(c: RulesConfig) -> str:
    """Each server's fill-in verdict (0 or 1) with the build it reports; topk keeps one build where replicas disagree."""
    return (f'max {c.without("verdict")} (specwatch_verdict{{verdict="fill_ins"}})\n'
            "  * on (job, server) group_left (build)\n"
            "topk by (job, server) (1, max by (job, server, build) (specwatch_server_info))")


def _indented(expr: str, pad: str) -> str:
    return pad + expr.replace("\n", "\n" + pad)


def _flip(c: RulesConfig) -> str:
    """The servers serving fill-ins of a build that flipped, each valued with how many servers of its build serve them."""
    by, each = ", ".join(FLIP_BY), _indented(_fill_ins_by_build(c), "    ")
    return ("(\n"
            f"  sum by ({by}) (\n{each}\n  ) >= {FLIP_SERVERS}\n"
            f"  and on ({by})\n"
            f"  avg by ({by}) (\n{each}\n  ) >= {FLIP_SHARE}\n"
            ")\n"
            f"  * on ({by}) group_right ()\n"
            f"(\n{_indented(_fill_ins_by_build(c), '  ')}\n  == 1\n)")


_POOL = "{{ with $labels.pool }}, pool {{ . }}{{ end }}"


def _differing(c: RulesConfig, match: str = "", *, joined: str = "\n") -> str:
    """The members of peer groups that differ: as every exporter replica watching one says (held over a restart, see
    SpecwatchReplicasDisagree), or as its file's content compares across every exporter and shard."""
    agreement = f"min_over_time(specwatch_peer_agreement{match}[{RESTART_BRIDGE}])"
    return f"max {c.without()} ({agreement}) == 0{joined}or{joined}{Recorded.FLEET_FINGERPRINT_AGREEMENT}{match} == 0"


_IN_GROUP = "{job=%q, peer_group=%q}"
_GROUP_ARGS = "$labels.job $labels.peer_group $labels.job $labels.peer_group"


def _members_differing(c: RulesConfig) -> str:
    """The members of the alert's group that differ, read at its evaluation: `server`, or `server/model` for a router's
    model (as the verdicts document names them), with its pool."""
    members = f"count by (server, model, pool) ({_differing(c, _IN_GROUP, joined=' ')})"
    return (f'{{{{ with printf "{members}" {_GROUP_ARGS} | query }}}} Members that differ: '
            '{{ range $i, $s := sortByLabel "server" . }}{{ if $i }}, {{ end }}{{ $s.Labels.server }}'
            "{{ with $s.Labels.model }}/{{ . }}{{ end }}{{ with $s.Labels.pool }} (pool {{ . }}){{ end }}{{ end }}.{{ end }}")


def _split(c: RulesConfig) -> str:
    """Whether a majority is left: the members compared (by an exporter or across shards) against those that differ."""
    compared = (f"count(count by (server, model) ({_held('specwatch_peer_agreement' + _IN_GROUP)} or "
                f"{Recorded.FLEET_FINGERPRINT_AGREEMENT}{_IN_GROUP}))")
    return (f'{{{{ with printf "{compared}" {_GROUP_ARGS} | query }}}}{{{{ if eq (. | first | value) $value }}}} No '
            "majority is left: every member compared differs (a pair that differs, or a group split without a "
            "majority), so nothing tells which one is right: hold each against a server known to serve the right file "
            "(`specwatch check URL URL ...`).{{ else }} The others agree: these differ from the group's majority."
            "{{ end }}{{ end }}")


# The peer group of the alert's server, read at its evaluation (its series of the peer probe do not carry it).
_GROUP = (
    '{{ with printf "max by (peer_group) (specwatch_model_fingerprint_info{job=%q, server=%q, model=%q})" '
    '$labels.job $labels.server $labels.model | query }} (peer group {{ . | first | label "peer_group" }}){{ end }}'
)


def _minutes(duration: str) -> int:
    assert duration.endswith("m"), duration
    return int(duration[:-1])


def alerts(c: RulesConfig) -> list[Alert]:
    up = f"up{{{c.job_selector}}}"
    unchecked = _held('specwatch_verdict{verdict="unchecked"}')
    return [
        Alert(
            "SpecwatchServingFillInLogprobs",
            "The verdict rests on a canary's answer, proof rather than a noisy sample, so it pages at once (no `for:`) and "
            "on any replica's proof. keep_firing_for bridges missed scrapes, exporter restarts (the series vanish, then "
            "read `unchecked` until the new process has canaried) and canaries that draft only sometimes (n-gram "
            "speculation), so one incident is one page, not a string of fire/resolve pairs.",
            f'max {c.without("verdict")} (specwatch_verdict{{verdict="fill_ins"}}) == 1',
            "critical",
            "llama-server {{ $labels.server }} serves fill-in logprobs",
            f"specwatch's canary on {{{{ $labels.server }}}}{_MODEL} got fill-in logprobs: tokens after the first with "
            f"logprob 0.0 (prob 1.0) and no alternatives, produced by speculative decoding.{_ENDPOINTS}{_PENDING} Every eval "
            "reading logprobs from this server now scores placeholders. Stop scoring against it, restart it without "
            "speculative decoding (drop -md/--model-draft and --spec-type), and re-run the evals it served.",
            keep_firing_for=RESTART_BRIDGE,
        ),
        Alert(
            "SpecwatchFleetUnwatched",
            "The guard of the page above: servers in specwatch's config (static and discovered) that no replica watches, "
            "because replicas are down or missing, or no specwatch target is up at all. Fill-ins there would never page, "
            "so this pages too. One replica down while its twin watches the same shard is only a ticket "
            "(SpecwatchExporterDown). It reads the series as they are, never held over a gap: the gap is what it "
            "pages for, and a restart shorter than its `for:` pages nobody.",
            "(\n"
            "  max by (job) (specwatch_configured_servers)\n"
            "    - on (job)\n"
            "  count by (job) (count by (job, server) (specwatch_verdict))\n"
            ") > 0\n"
            "or on (job)\n"
            "(max by (job) (specwatch_configured_servers) > 0 unless on (job) count by (job) (specwatch_verdict))\n"
            "or\n"
            f"absent({up} == 1)",
            "critical",
            'specwatch watches no server of {{ or $labels.job "its job" }} or misses some',
            "{{ if $labels.job }}{{ $value }} of the servers in specwatch's config (job {{ $labels.job }}) are watched by "
            "no specwatch replica{{ else }}No specwatch target is up{{ end }}, so fill-in logprobs on them would not page. "
            "Bring the missing replicas back (kubectl get pods / systemctl status specwatch@*), or fix the scrape config. "
            "While this fires, nothing else about those servers can fire.",
            for_="5m",
        ),
        Alert(
            "SpecwatchFleetServingFillInLogprobs",
            "A fleet that flips at once pages once: one alert per server of the flip (FLIP_* in alerts/generate.py say "
            "when), grouped per job, pool and build in examples/alertmanager.yml, where it inhibits those servers' own "
            "pages. It reads what they read, in the same group, so it fires in the evaluation the flip is seen in: the pages "
            "of the servers proven until then are inhibited if that is within their group_wait. "
            "keep_firing_for as the page's: both end together, and a server still bad once the flip is over pages on "
            "its own.",
            _flip(c),
            "critical",
            "llama-servers of build {{ $labels.build }} serve fill-in logprobs all at once (job {{ $labels.job }}"
            f"{_POOL})",
            f"{{{{ $labels.server }}}}{_MODEL} serves fill-in logprobs, as did {{{{ $value }}}} servers of build "
            f"{{{{ $labels.build }}}} in job {{{{ $labels.job }}}}{_POOL} when it was found, at least {FLIP_SHARE:.0%} of "
            "that build's servers there: one cause, most likely a build that turns speculative decoding on by default "
            "(llama.cpp PR #28391, ngram-mod). This notification lists every server of the flip, one alert each; their "
            "own pages are inhibited while it fires. Stop scoring evals against this build, restart its servers with "
            "--no-spec-type (or roll the build back), and re-run the evals they served.",
            keep_firing_for=RESTART_BRIDGE,
        ),
        Alert(
            "SpecwatchLogprobsUnproven",
            "The server speculates and no canary drafted, or speculation cannot be seen (/slots off) and the canaries "
            "lacked a long enough raw-prompt or chat endpoint: its logprobs are not proven real. A ticket: an eval harness "
            "running `specwatch check` refuses it already; n-gram speculation may start drafting later. max_over_time, "
            "not last_over_time: after a restart the verdict reads `unchecked` until the canaries have run again, and "
            "that must not start the 15 minutes afresh either; a replica that knows better now (clean, or fill-ins, "
            "which page) ends it at once.",
            f'min {c.without("verdict")} (max_over_time(specwatch_verdict{{verdict="unproven"}}[{RESTART_BRIDGE}])) == 1\n'
            f'unless on (job, server, model) max {c.without("verdict")} (specwatch_verdict{{verdict=~"clean|fill_ins"}}) == 1',
            "warning",
            "llama-server {{ $labels.server }} may speculate and its logprobs are not proven real",
            f"{{{{ $labels.server }}}}{_MODEL} reports speculative decoding on but no canary made it draft, or hides "
            "/slots and was not canaried on both a raw-prompt and a chat endpoint long enough (the landing page's why "
            "column says which), so specwatch cannot tell whether its logprobs are real. `specwatch check` exits 1 for "
            "it. Remove speculative decoding from the server, or accept it stays out of logprob evals.",
            for_="15m",
        ),
        Alert(
            "SpecwatchReplicasDisagree",
            "A second judgement beside the fill-in verdict: the replicas of a peer group serve more than one model, so "
            "an eval behind the pool mixes models. One ticket per group, never one per member: in a pair that differs "
            "or a split without a majority every member differs, and which one is right is the group's question. "
            "Either witness makes a member differ: the exporter (specwatch_peer_agreement 0: its file's content at "
            "once, its answers once the sequential test decides), as every replica watching it says (max), or its "
            "file's content compared across every exporter and shard. min_over_time, not last_over_time: a restarted "
            "exporter begins the test anew and says the member agrees until its answers decide again, and a test at "
            "its threshold may dip below it for an answer; neither must start the group's `for:` afresh or resolve a "
            f"firing ticket (a member that agrees again ends it {RESTART_BRIDGE} later). A ticket, as `specwatch check "
            "--exporter` refuses the pool already.",
            "count by (job, peer_group) (\n"
            "  count by (job, peer_group, server, model) (\n"
            f"{_indented(_differing(c), '    ')}\n"
            "  )\n"
            ")",
            "warning",
            "Replicas of peer group {{ $labels.peer_group }} serve different models (members that differ: {{ $value }})",
            "The replicas of peer group {{ $labels.peer_group }} (job {{ $labels.job }}) do not all serve one model, so "
            f"an eval routed across the group scores a mix of models.{_members_differing(c)}{_split(c)} Each member's "
            "peers object in the exporter's /api/v1/verdicts (its landing page, `specwatch check --exporter URL`) says "
            "how it differs: kind fingerprint (its file's content: quantization, size or shape) or answers (the "
            "sequential test over its peer-probe answers decided), the replicas it is held against and the evidence. "
            "Another build or file name alone never fires this (the peers object shows it as deployment). Take the "
            "members that differ out of the pool (or the group: peer_group in specwatch's config), serve them the file "
            "the others serve, and re-run the evals the group served meanwhile.",
            for_=PEER_FOR,
        ),
        Alert(
            "SpecwatchPeerProbeFailing",
            'The catch-all of "could not compare": a member whose peer probes keep failing holds its group up (a group '
            "compares a question once every member that answers has answered it), so specwatch never silently stops "
            "comparing a group. Every replica watching the member must fail, none succeed; PROBE_WINDOW and PROBE_FOR "
            "in alerts/generate.py say why so long. A server that is down is neither probed nor waited for "
            "(SpecwatchServerDown), nor is a router model not loaded.",
            f"sum {c.without('outcome')} (increase(specwatch_peer_probes_total{{outcome=\"failure\"}}[{PROBE_WINDOW}])) > 0\n"
            "unless on (job, server, model)\n"
            f"sum {c.without('outcome')} (increase(specwatch_peer_probes_total{{outcome=\"success\"}}[{PROBE_WINDOW}])) > 0\n"
            f"{_loaded(c)}",
            "warning",
            "Peer probes of {{ $labels.server }} keep failing: its peer group's answers are not compared",
            f"specwatch's peer probe of {{{{ $labels.server }}}}{_MODEL}{_GROUP} fails on every replica watching it, with "
            f"no success for {_minutes(PROBE_WINDOW) + _minutes(PROBE_FOR)} minutes (or none since it joined its group, "
            f"{_minutes(PROBE_FOR)} minutes ago or more). Its group waits for its answers, so the answers of the group are "
            "not compared (the files' content still is), and a replica serving other weights would go unnoticed. Look "
            'at specwatch_peer_probe_failures_total{server="{{ $labels.server }}"} for the reason (timeout, '
            "unauthorized, a front end refusing /v1/completions, ...) and the exporter's peer_probe_failed log lines; "
            "fix the server or the route to it, or take it out of the group (peer_group: none in specwatch's config).",
            for_=PROBE_FOR,
        ),
        Alert(
            "SpecwatchVerdictUnchecked",
            'The catch-all of "could not check": whatever keeps the verdict unknown (no canary has ever run, an endpoint '
            "never answered) files a ticket, so specwatch never silently stops watching a server. The more specific "
            "tickets (ServerDown, CanaryStale, CanaryFailing) inhibit it in examples/alertmanager.yml.",
            f"min {c.without('verdict')} ({unchecked}) == 1\n{_loaded(c)}",
            "warning",
            "specwatch cannot reach a verdict on {{ $labels.server }}",
            f"specwatch has had no verdict on the logprobs of {{{{ $labels.server }}}}{_MODEL} for 15 minutes: the server is "
            "down, refuses specwatch, returns no logprobs, or an endpoint's canary does not succeed. Fill-in logprobs on "
            "it would not page. The landing page of the exporter says why.",
            for_="15m",
        ),
        Alert(
            "SpecwatchSpeculationContradiction",
            "A config audit problem, not an incident: it only needs to be stable before it files a ticket.",
            f"max {c.without()} ({_held('specwatch_speculation_contradiction')}) == 1",
            "warning",
            "llama-server {{ $labels.server }} speculates while /props says it does not",
            f"/slots on {{{{ $labels.server }}}}{_MODEL} reports speculative decoding on, while /props reports "
            'speculative.types "none". Audits and dashboards that read /props are misled about this server. Check its '
            "command line for -md/--model-draft or --spec-type, and decide whether evals may use it.",
            for_="10m",
        ),
        Alert(
            "SpecwatchCanaryStale",
            "Two and a half canary intervals with no successful canary on any endpoint (one endpoint is canaried in turn "
            "every interval, every two on a server given the larger speculating canary), then 2m more, so that a server "
            "that went down pages SpecwatchServerDown (for: 2m) first and the inhibition in examples/alertmanager.yml "
            "keeps one ticket for the cause. The exporter exposes its configured interval, so the rule follows the config. "
            "A restarted exporter knows no past canary, so it has no timestamp to age until one succeeds: "
            "keep_firing_for, not last_over_time (which would age a removed server's last timestamp into a ticket), "
            "keeps a firing ticket through the restart; if the canaries still fail, SpecwatchCanaryFailing and "
            "SpecwatchVerdictUnchecked, whose timers run on, say so.",
            "(\n"
            f"  time() - max {c.without('endpoint')} (specwatch_canary_last_success_timestamp_seconds)\n"
            "    > on (job) group_left () (2.5 * max by (job) (specwatch_canary_interval_seconds))\n"
            ")\n"
            f"{_loaded(c)}",
            "warning",
            "No successful canary on {{ $labels.server }} for {{ $value | humanizeDuration }}",
            f"The last successful canary on {{{{ $labels.server }}}}{_MODEL} finished {{{{ $value | humanizeDuration }}}} "
            "ago, on every endpoint. specwatch is blind to fill-in logprobs on this server: its verdict is stale. Look at "
            "specwatch_canary_failures_total for the reason.",
            for_="2m",
            keep_firing_for=RESTART_BRIDGE,
        ),
        Alert(
            "SpecwatchCanaryFailing",
            "An endpoint whose last canary failed is retried every canary_interval, so five minutes is a run of failed "
            "canaries on every replica; a single success resets it.",
            f"max {c.without()} ({_held('specwatch_canary_success')}) == 0\n{_loaded(c)}",
            "warning",
            "Canary on {{ $labels.server }} endpoint {{ $labels.endpoint }} keeps failing",
            "specwatch's canary request to the {{ $labels.endpoint }} endpoint of "
            f"{{{{ $labels.server }}}}{_MODEL} has failed for 5 minutes, so fill-in logprobs on that endpoint would go "
            'unnoticed. Look at specwatch_canary_failures_total{server="{{ $labels.server }}"} for the reason '
            "(unauthorized, timeout, no logprobs, ...) and fix the server or specwatch's config for it.",
            for_="5m",
        ),
        Alert(
            "SpecwatchServerDown",
            "Down on every replica that watches it: one replica's network trouble is not the server's.",
            f"max {c.without()} ({_held('specwatch_up')}) == 0",
            "warning",
            "llama-server {{ $labels.server }} is down or unreadable",
            "specwatch has not got valid answers from /health, /props and /slots of {{ $labels.server }} for 2 minutes. "
            "The server is down, unreachable, or refuses specwatch's API key. Look at "
            'specwatch_poll_failures_total{server="{{ $labels.server }}"} for the reason.',
            for_="2m",
        ),
        Alert(
            "SpecwatchConfigReloadFailed",
            "The previous config keeps running, so there is time to fix a typo before a ticket is filed.",
            f"{_held('specwatch_config_last_reload_successful')} == 0",
            "warning",
            "specwatch {{ $labels.instance }} rejected its new configuration",
            "The last configuration reload of specwatch at {{ $labels.instance }} failed and the previous configuration is "
            "still running, so changes to the watched servers have not taken effect. Run "
            "`specwatch run --check-config --config FILE` to see every problem, fix the file, and reload again.",
            for_="5m",
        ),
        Alert(
            "SpecwatchExporterDown",
            "One replica down is a ticket: its twin watches the same shard. When no replica watches some servers, "
            "SpecwatchFleetUnwatched pages. Prometheus' own `up`: a restart ends it, and one shorter than its `for:` "
            "files nothing.",
            f"{up} == 0",
            "warning",
            "specwatch exporter {{ $labels.instance }} is down",
            "Prometheus cannot scrape specwatch at {{ $labels.instance }} (job {{ $labels.job }}). If another replica "
            "watches the same shard nothing is unwatched; otherwise SpecwatchFleetUnwatched pages. Check that `specwatch "
            "run` is running and listening there, and that the scrape config points at it.",
            for_="5m",
        ),
        Alert(
            "SpecwatchNoServers",
            "A config or discovery source that yields no server watches nothing, silently.",
            f"max by (job) ({_held('specwatch_configured_servers')}) == 0",
            "warning",
            "specwatch ({{ $labels.job }}) has no server to watch",
            "Every specwatch replica of job {{ $labels.job }} reports an empty fleet: its discovery sources yield no "
            "target. Check the file_sd files or the http_sd endpoint in specwatch's config (the exporter's log says what "
            "each source returned).",
            for_="10m",
        ),
        Alert(
            "SpecwatchDiscoveryFailing",
            "A refused target file or a failing http_sd endpoint keeps its last good targets, so nothing is unwatched yet; "
            "but servers added or removed since are not followed. A ticket, after a while to fix a typo.",
            f"{_held('specwatch_discovery_refresh_successful')} == 0",
            "warning",
            "specwatch {{ $labels.instance }} cannot refresh discovery source {{ $labels.source }}",
            "The last refresh of {{ $labels.source }} on specwatch {{ $labels.instance }} was refused: a target file that "
            "is not valid (empty, not JSON/YAML, a bad target) or an http_sd endpoint that fails. Its previous targets are "
            "still watched, but changes to the fleet are not followed. The exporter's `discovery_refused` log line says "
            "what is wrong.",
            for_="10m",
        ),
    ]


def groups(c: RulesConfig) -> list[tuple[str, list[Record] | list[Alert]]]:
    return [("specwatch.recording", recording(c)), ("specwatch.peers", peers(c)), ("specwatch.llama-server", llama_server(c)),
            ("specwatch.alerts", alerts(c))]


def data(c: RulesConfig) -> dict:
    """The rules as Prometheus reads them: what the written file must load back to."""
    def rule(item: Record | Alert) -> dict:
        if isinstance(item, Record):
            return {"record": item.name, "expr": item.expr}
        timing = {key: value for key, value in (("for", item.for_), ("keep_firing_for", item.keep_firing_for)) if value}
        return {"alert": item.name, "expr": item.expr, **timing, "labels": {"severity": item.severity},
                "annotations": {"summary": item.summary, "description": item.description,
                                "runbook_url": c.runbook(item.name)}}

    return {"groups": [{"name": name, "rules": [rule(item) for item in items]} for name, items in groups(c)]}


# --- YAML text ---------------------------------------------------------------------------------------------------


def _plain_ok(value: str) -> bool:
    try:
        return yaml.safe_load(f"key: {value}") == {"key": value}
    except yaml.YAMLError:
        return False


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def scalar(key: str, value: str, indent: int, *, style: str = "plain") -> list[str]:
    """`key: value` at `indent`: a literal block when multi-line, folded when asked and long, else plain or quoted."""
    pad, inner = " " * indent, " " * (indent + 2)
    if "\n" in value:
        assert not value[0].isspace() and not value.endswith("\n"), value
        return [f"{pad}{key}: |-", *(f"{inner}{line}" if line else "" for line in value.split("\n"))]
    foldable = value == value.strip() and "  " not in value
    if style == "folded" and foldable and len(pad) + len(key) + 2 + len(value) > WIDTH:
        return [f"{pad}{key}: >-", *wrap(value, inner, inner)]
    if style == "plain" and _plain_ok(value):
        return [f"{pad}{key}: {value}"]
    return [f"{pad}{key}: {_quoted(value)}"]


# A template action ({{ ... }}) or a code span (`...`) stays on one line, so each reads whole.
_UNBROKEN = re.compile(r"\{\{.*?\}\}|`[^`]*`")


def wrap(text: str, first: str, rest: str) -> list[str]:
    """`text` in lines of at most WIDTH, broken at single spaces only (so a folded scalar reads back the same)."""
    glued = _UNBROKEN.sub(lambda match: match.group().replace(" ", "\0"), text)
    lines = textwrap.wrap(glued, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                          break_on_hyphens=False)
    return [line.replace("\0", " ") for line in lines]


def comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    return wrap(text, f"{pad}# ", f"{pad}# ")


def _listed(labels: Sequence[str]) -> str:
    quoted = [f"`{label}`" for label in labels]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def command(script: str, c: RulesConfig) -> str:
    return shlex.join(["python", script, *c.flags()])


def header(c: RulesConfig) -> list[str]:
    return [
        "# Prometheus rules for specwatch: recording rules for the fleet panels, and the alerts that page or file tickets.",
        "# Generated by alerts/generate.py; do not edit: change the generator and run",
        f"#   {command('alerts/generate.py', c)}",
        "# Load with `rule_files:` (see examples/prometheus.yml).",
        "# severity=critical pages on-call; severity=warning files a ticket (see examples/alertmanager.yml).",
        *comment(f"Runbooks (--runbook-base-url), one section per alert: {c.runbook_base_url}", 0),
        *comment(f"specwatch's own scrape targets (--job-selector): up{{{c.job_selector}}}", 0),
        "#",
        *comment("Replicas: several specwatch replicas may watch the same servers (two per shard, so an upgrade or a crash "
                 f"leaves none unwatched). Their series differ only in the target labels {_listed(c.aggregate_away)}, so "
                 "every per-server rule first aggregates those away: one server, one alert, however many replicas watch "
                 "it. If your replicas differ in other target labels, name them all with --aggregate-away.", 0),
        *comment("Router models: a model the router has not loaded is never probed (probing would load it); its verdict is "
                 "`unchecked` and no alert fires for it: rules drop models whose specwatch_model_loaded is 0.", 0),
        *comment("Restarts: the series of an exporter that restarts (or of a replica rolled) go stale until it is back, "
                 f"then read `unchecked` until its first canaries, seconds later. The page keeps firing through that "
                 f"({RESTART_BRIDGE}, keep_firing_for); the tickets read the exporter's series through last_over_time over "
                 f"{RESTART_BRIDGE}, so their `for:` runs on across the gap and a firing ticket does not resolve in it (a "
                 "server removed from the config keeps its tickets that long too). SpecwatchFleetUnwatched and "
                 "SpecwatchExporterDown read the gap itself.", 0),
    ]


def render(c: RulesConfig) -> str:
    lines = [*header(c), "groups:"]
    for number, (name, items) in enumerate(groups(c)):
        if number:
            lines.append("")
        lines += [f"  - name: {name}", "    rules:"]
        for position, item in enumerate(items):
            if isinstance(item, Record):
                lines += comment(item.note, 6) if item.note else []
                lines += [f"      - record: {item.name}", *scalar("expr", item.expr, 8)]
                continue
            if position:
                lines.append("")
            lines += [f"      - alert: {item.name}", *comment(item.note, 8), *scalar("expr", item.expr, 8)]
            lines += [f"        for: {item.for_}"] if item.for_ else []
            lines += [f"        keep_firing_for: {item.keep_firing_for}"] if item.keep_firing_for else []
            lines += ["        labels:", f"          severity: {item.severity}", "        annotations:",
                      *scalar("summary", item.summary, 10, style="quoted"),
                      *scalar("description", item.description, 10, style="folded"),
                      *scalar("runbook_url", c.runbook(item.name), 10)]
    text = "\n".join(lines) + "\n"
    if yaml.safe_load(text) != data(c):  # the layout must not change a single value
        raise AssertionError("the written rules do not load back to the rules")
    if not all(alert.name.startswith(ALERT_PREFIX) for alert in alerts(c)):
        raise AssertionError(f"an alert's name lacks the {ALERT_PREFIX} prefix the dashboards list alerts by")
    return text


# --- command line ------------------------------------------------------------------------------------------------


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-selector", default=DEFAULT_JOB_SELECTOR, metavar="MATCHERS",
                        help=f"label matchers of specwatch's own scrape targets (default: {DEFAULT_JOB_SELECTOR})")
    parser.add_argument("--aggregate-away", default=",".join(DEFAULT_AGGREGATE_AWAY), metavar="LABEL,...",
                        help="target labels in which replicas watching the same servers differ; per-server rules drop "
                             f"them (default: {','.join(DEFAULT_AGGREGATE_AWAY)})")
    parser.add_argument("--runbook-base-url", default=DEFAULT_RUNBOOK_BASE_URL, metavar="URL",
                        help="address of your copy of docs/runbooks.md; each alert adds #its-name-in-lower-case "
                             f"(default: {DEFAULT_RUNBOOK_BASE_URL})")


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RulesConfig:
    """The config the flags give, or the parser's usage error listing every problem."""
    try:
        labels = tuple(label.strip() for label in args.aggregate_away.split(","))
        return RulesConfig(args.job_selector, labels if any(labels) else (), args.runbook_base_url)
    except ConfigError as err:
        parser.error(f"\n{err}")


def write_or_check(text: str, out: Path, *, check: bool, regenerate: str) -> int:
    if not check:
        out.write_text(text, encoding="utf-8")
        return 0
    if not out.is_file() or out.read_text(encoding="utf-8") != text:
        print(f"{out.name} is out of date: run {regenerate}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_arguments(parser)
    parser.add_argument("--out", type=Path, default=TARGET, help="where to write (default: alerts/specwatch.rules.yml)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file at --out differs from what would be written")
    args = parser.parse_args(argv)
    config = config_from_args(parser, args)
    return write_or_check(render(config), args.out, check=args.check, regenerate=command("alerts/generate.py", config))


if __name__ == "__main__":
    sys.exit(main())
