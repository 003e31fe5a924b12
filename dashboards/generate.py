"""Build specwatch's Grafana dashboards with grafana-foundation-sdk and write them as JSON next to this file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The rules generator owns the names both read (recording rules, alert prefix, llama-server job); a script run as
# `python dashboards/generate.py` has only dashboards/ on its path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from alerts.generate import ALERT_PREFIX, LLAMA_SERVER_JOB, PEER_FOR, Recorded

HERE = Path(__file__).resolve().parent
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
FLEET_UID = "specwatch-fleet"
SERVER_UID = "specwatch-server"
TAGS = ["specwatch", "llama-server"]
# Every query of a panel filters on these; the per-server dashboard selects a single server.
MATCH = 'job=~"$job", server=~"$server"'
# Series about one model (a router's, or a server's only one, whose model label is empty and matches ".*").
MODEL_MATCH = 'job=~"$job", server=~"$server", model=~"$model"'
# llama-server's own counters, scraped through specwatch's /sd (examples/prometheus.yml, job "llama-server").
LLAMA_MATCH = 'job=~"$llama_job", server=~"$server", model=~"$model"'


def query(expr: str, legend: str = "__auto", ref: str = "A", *, as_table: bool = False) -> prometheus.Dataquery:
    built = prometheus.Dataquery().expr(expr).ref_id(ref).legend_format(legend).datasource(DATASOURCE)
    if as_table:
        built = built.instant().format(PromQueryFormat.TABLE)
    else:
        built = built.range()
    return built


def steps(*pairs: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return dash.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
        [model.Threshold(value=value, color=color) for value, color in pairs]
    )


def words(mapping: dict[str, tuple[str, str]]) -> list[model.ValueMapping]:
    return [model.ValueMap(options={v: model.ValueMappingResult(text=t, color=c, index=i)
                                    for i, (v, (t, c)) in enumerate(mapping.items())})]


SERVING_WORDS = words({"0": ("real logprobs", "green"), "1": ("FILL-INS", "red")})
ENDPOINT_WORDS = words({"0": ("did not draft, logprobs real", "green"), "1": ("drafted, logprobs real", "blue"),
                        "2": ("FILL-INS", "red"), "3": ("FILL-INS", "red")})
VERDICT_WORDS = words({"0": ("clean", "green"), "1": ("unchecked", "orange"), "2": ("unproven", "yellow"),
                       "3": ("FILL_INS", "red")})


def verdict_rank(match: str) -> str:
    """specwatch_verdict as one number per series, worst highest, for the verdict timelines and stats."""
    rank = {"fill_ins": 3, "unproven": 2, "unchecked": 1}
    terms = [f'(specwatch_verdict{{{match}, verdict="{name}"}} * {value})' for name, value in rank.items()]
    return " + ignoring (verdict) ".join(terms)
AGREEMENT_WORDS = words({"0": ("DISAGREES", "red"), "1": ("agrees", "green")})
ON_OFF_WORDS = words({"0": ("off", "green"), "1": ("on", "orange")})
UP_WORDS = words({"0": ("down", "red"), "1": ("up", "green")})
LOADED_WORDS = words({"0": ("not loaded", "blue"), "1": ("loaded", "green")})


def legend() -> common_builder.VizLegendOptions:
    return (common_builder.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT).show_legend(True).calcs(["lastNotNull", "max"]))


def big_number(title: str, expr: str, description: str, *, width: int = 4, unit: str = "none",
               thresholds: dash.ThresholdsConfig | None = None,
               mappings: list[model.ValueMapping] | None = None) -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).datasource(DATASOURCE).with_target(query(expr))
             .height(4).span(width).unit(unit).color_mode(common.BigValueColorMode.BACKGROUND)
             .graph_mode(common.BigValueGraphMode.NONE)
             .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if thresholds is not None:
        panel = panel.thresholds(thresholds)
    if mappings is not None:
        panel = panel.mappings(mappings)
    return panel


def graph(title: str, description: str, *targets: prometheus.Dataquery, unit: str = "none", width: int = 12,
          height: int = 8, min_value: float | None = None, max_value: float | None = None) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).targets(list(targets))
             .unit(unit).span(width).height(height).legend(legend()).show_points(common.VisibilityMode.NEVER)
             .line_width(1).fill_opacity(10))
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def timeline(title: str, description: str, expr: str, legend_format: str, mappings: list[model.ValueMapping],
             width: int = 24, height: int = 7) -> statetimeline.Panel:
    return (statetimeline.Panel().title(title).description(description).datasource(DATASOURCE)
            .with_target(query(expr, legend_format)).mappings(mappings).span(width).height(height)
            .show_value(common.VisibilityMode.NEVER).merge_values(True))


def merged_table(title: str, description: str, columns: dict[str, str], *, width: int = 24, height: int = 8,
                 hide: tuple[str, ...] = ()) -> table.Panel:
    """One row per series label set: each column is an instant query, joined on the labels they share."""
    refs = [chr(ord("A") + i) for i in range(len(columns))]
    targets = [query(expr, ref=ref, as_table=True) for ref, expr in zip(refs, columns.values(), strict=True)]
    # Grafana names a lone query's value column "Value", and "Value #<refId>" when there are several.
    rename = ({"Value": next(iter(columns))} if len(columns) == 1
              else {f"Value #{ref}": name for ref, name in zip(refs, columns, strict=True)})
    excluded = {name: True for name in ("Time", "__name__", *hide)}
    return (table.Panel().title(title).description(description).datasource(DATASOURCE).targets(targets)
            .span(width).height(height)
            .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
            .with_transformation(model.DataTransformerConfig(
                id_val="organize", options={"excludeByName": excluded, "renameByName": rename})))


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def job_variable() -> dash.QueryVariable:
    return (dash.QueryVariable("job").label("Job").datasource(DATASOURCE)
            .query({"query": "label_values(specwatch_build_info, job)", "refId": "PrometheusVariableQueryEditor-VariableQuery"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(model.VariableOption(selected=True, text="All", value="$__all")))


def server_variable(*, many: bool) -> dash.QueryVariable:
    variable = (dash.QueryVariable("server").label("Server").datasource(DATASOURCE)
                .query({"query": 'label_values(specwatch_up{job=~"$job"}, server)',
                        "refId": "PrometheusVariableQueryEditor-VariableQuery"})
                .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC))
    if many:
        variable = (variable.multi(True).include_all(True).all_value(".*")
                    .current(model.VariableOption(selected=True, text="All", value="$__all")))
    return variable


def model_variable() -> dash.QueryVariable:
    """A router's models (a server watched without one has none: "All" matches it too)."""
    return (dash.QueryVariable("model").label("Model").datasource(DATASOURCE)
            .query({"query": 'label_values(specwatch_verdict{job=~"$job", server=~"$server"}, model)',
                    "refId": "PrometheusVariableQueryEditor-VariableQuery"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(model.VariableOption(selected=True, text="All", value="$__all")))


def llama_job_variable() -> dash.CustomVariable:
    """The scrape job of llama-server's own /metrics (through specwatch's /sd), for the drafted-token panels."""
    return (dash.CustomVariable("llama_job").label("llama-server job").values(LLAMA_SERVER_JOB)
            .current(model.VariableOption(selected=True, text=LLAMA_SERVER_JOB, value=LLAMA_SERVER_JOB)))


def base(uid: str, title: str, description: str) -> dash.Dashboard:
    return (dash.Dashboard(title).uid(uid).description(description).tags(TAGS).editable().refresh("1m")
            .time("now-6h", "now").timezone("browser").tooltip(model.DashboardCursorSync.CROSSHAIR)
            .link(dash.DashboardLink("specwatch dashboards").type(model.DashboardLinkType.DASHBOARDS).tags(["specwatch"])
                  .as_dropdown(True).include_vars(True).keep_time(True)))


def fleet() -> model.Dashboard:
    server_link = dash.DashboardLink("Open ${__data.fields.server}").url(
        f"/d/{SERVER_UID}?var-datasource=${{datasource}}&var-job=${{__data.fields.job}}"
        "&var-server=${__data.fields.server}&${__url_time_range}")
    board = (base(FLEET_UID, "specwatch / fleet",
                  "Which llama-servers serve fill-in logprobs under speculative decoding, since when, and how bad.")
             .with_variable(datasource_variable()).with_variable(job_variable()).with_variable(server_variable(many=True))
             .with_variable(model_variable()).with_variable(llama_job_variable()))

    board = board.with_row(dash.Row("Now"))
    for verdict, color, description in (
        ("fill_ins", "red", "Servers whose verdict is fill_ins: a canary found fill-in logprobs (pages)."),
        ("unproven", "yellow", "Servers that speculate per /slots or /props while no canary drafted: logprobs not proven."),
        ("unchecked", "orange", "Servers without a verdict: down, refusing specwatch, no logprobs or an endpoint failing."),
        ("clean", "green", "Servers whose every canary token carries its alternatives."),
    ):
        board = board.with_panel(big_number(
            f"Verdict {verdict}", f'sum({Recorded.VERDICTS}{{job=~"$job", verdict="{verdict}"}}) or vector(0)',
            description, width=6,
            thresholds=steps((None, "green")) if verdict == "clean" else steps((None, "green"), (1, color))))
    board = board.with_panel(big_number(
        "Servers serving fill-ins", f'sum({Recorded.SERVING_FILL_INS}{{job=~"$job"}})',
        "Servers whose last successful canary found fill-in logprobs (pages as SpecwatchServingFillInLogprobs).",
        thresholds=steps((None, "green"), (1, "red"))))
    board = board.with_panel(big_number(
        "Share of servers serving fill-ins", f'max({Recorded.SERVING_FILL_INS_SHARE}{{job=~"$job"}})',
        "Of the servers with a canary verdict, the share that serves fill-ins.", unit="percentunit",
        thresholds=steps((None, "green"), (0.000001, "red"))))
    board = board.with_panel(big_number(
        "Fill-in fraction, worst endpoint", f'max({Recorded.FILL_IN_TOKEN_RATIO}{{job=~"$job"}})',
        "Fill-in tokens among all canary tokens across the fleet, on the endpoint where it is highest.",
        unit="percentunit", thresholds=steps((None, "green"), (0.000001, "red"))))
    board = board.with_panel(big_number(
        "Servers watched", 'sum(specwatch_servers{job=~"$job"})', "Servers the specwatch exporters watch.",
        thresholds=steps((None, "blue")), width=3))
    board = board.with_panel(big_number(
        "Servers down", f"count(specwatch_up{{{MATCH}}} == 0) or vector(0)",
        "Servers whose last poll of /health, /props and /slots failed.", thresholds=steps((None, "green"), (1, "orange")),
        width=3))
    board = board.with_panel(big_number(
        "Canary endpoints failing", f"count(specwatch_canary_success{{{MODEL_MATCH}}} == 0) or vector(0)",
        "Server and endpoint pairs whose last canary failed: specwatch cannot vouch for them.",
        thresholds=steps((None, "green"), (1, "orange")), width=3))
    board = board.with_panel(big_number(
        "Canary tokens per hour", f'sum({Recorded.CANARY_TOKENS_PER_HOUR}{{job=~"$job"}}) or vector(0)',
        "Tokens the canaries made the watched servers generate over the last hour: the price of watching "
        "(about 480 per steady server-hour at the defaults; more while servers change or speculate).",
        thresholds=steps((None, "blue")), width=3))

    board = board.with_panel(merged_table(
        "Servers", "What each server serves now; 'serving fill-ins' 1 means its logprobs are placeholders.",
        {
            "verdict": f"max by (job, server, model) ({verdict_rank(MODEL_MATCH)})",
            "serving fill-ins": f"max by (job, server, model) (specwatch_serving_placeholders{{{MODEL_MATCH}}})",
            "up": f"max by (job, server) (specwatch_up{{{MATCH}}})",
            "speculation (/slots)": (
                f'max by (job, server, model) '
                f'(specwatch_speculation_enabled{{{MODEL_MATCH}, source="slots"}})'
            ),
            "speculation (/props)": (
                f'max by (job, server, model) '
                f'(specwatch_speculation_enabled{{{MODEL_MATCH}, source="props"}})'
            ),
            "worst placeholder ratio": f"max by (job, server, model) (specwatch_canary_placeholder_ratio{{{MODEL_MATCH}}})",
            "build and model": f"max by (job, server, build, model) (specwatch_server_info{{{MODEL_MATCH}}})",
        },
        hide=("Value #G",), height=9,
    ).data_links([server_link]).override_by_name("verdict", [
        model.DynamicConfigValue(id_val="mappings", value=VERDICT_WORDS),
        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]).override_by_name("serving fill-ins", [
        model.DynamicConfigValue(id_val="mappings", value=SERVING_WORDS),
        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]))
    board = board.with_panel(timeline(
        "Verdict, since when",
        "Per server, the verdict specwatch check and the alerts use: clean, unchecked, unproven or FILL_INS.",
        f"max by (server, model) ({verdict_rank(MODEL_MATCH)})", "{{server}} {{model}}", VERDICT_WORDS))
    board = board.with_panel(timeline(
        "Serving fill-ins, since when",
        "Per server, whether the last successful canary found fill-in logprobs; the red span is the window whose evals "
        "need re-running.",
        f"max by (server, model) (specwatch_serving_placeholders{{{MODEL_MATCH}}})", "{{server}} {{model}}", SERVING_WORDS))
    board = board.with_panel(timeline(
        "Speculation, /slots vs /props",
        "What each endpoint reports. /props says none on every current llama-server, so only /slots can be trusted; "
        "a server on in /slots and off in /props is a config-audit contradiction.",
        f"max by (server, model, source) (specwatch_speculation_enabled{{{MODEL_MATCH}}})",
            "{{server}} {{model}} /{{source}}", ON_OFF_WORDS))

    board = board.with_row(dash.Row("Replicas and their peers"))
    peer = f"{MODEL_MATCH}, peer_group!=\"\""
    member = "job, peer_group, server, model"
    # The measured noise carries no peer_group: each member's is given the group its fingerprint names.
    in_group = (f"topk by (job, server, model) (1, max by ({member}) (specwatch_model_fingerprint_info{{{peer}}}))")
    board = board.with_panel(merged_table(
        "Replicas that disagree with their peers",
        "Per member of a peer group (servers that report the same model, or share peer_group in the config): whether "
        "the exporter watching the group finds it agreeing with the group's majority (its file's content at once, its "
        "answers to the peer probe once the sequential test decides); whether its file's content agrees across every "
        "exporter and shard; the evidence, how far the test has come towards deciding that its answers differ (100% "
        "decided; a healthy replica's stays near 0); the batching noise measured on it, in nats, which its differences "
        "are weighed against; and its file and build, shown, never compared (a rolling upgrade or a renamed file is no "
        f"disagreement). A group with a member that differs files SpecwatchReplicasDisagree after {PEER_FOR}, one "
        "ticket for the group; the exporter's /api/v1/verdicts says the kind and the replicas it is held against.",
        {
            "agrees (exporter)": f"max by ({member}) (specwatch_peer_agreement{{{peer}}})",
            "content agrees (fleet)": f"max by ({member}) ({Recorded.FLEET_FINGERPRINT_AGREEMENT}{{{peer}}})",
            "evidence": f"max by ({member}) (specwatch_peer_evidence{{{peer}}})",
            "noise": f"max by ({member}) (specwatch_peer_noise_nats{{{MODEL_MATCH}}} * on (job, server, model) "
                     f"group_left (peer_group) {in_group})",
            "file and quantization": f"max by ({member}, file, ftype, build) (specwatch_model_fingerprint_info{{{peer}}})",
        },
        hide=("Value #E",), height=8,
    ).data_links([server_link]).override_by_name("agrees (exporter)", [
        model.DynamicConfigValue(id_val="mappings", value=AGREEMENT_WORDS),
        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]).override_by_name("content agrees (fleet)", [
        model.DynamicConfigValue(id_val="mappings", value=AGREEMENT_WORDS),
        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]).override_by_name("evidence", [
        model.DynamicConfigValue(id_val="unit", value="percentunit"),
    ]).override_by_name("noise", [
        model.DynamicConfigValue(id_val="unit", value="suffix: nats"),
    ]))
    board = board.with_panel(timeline(
        "Agreement with peers, since when",
        "Per member of a peer group, whether the exporter finds it agreeing with its group's majority; the red span is "
        "the window in which an eval behind the group mixed models. In a pair that differs, or a group split without a "
        "majority, every member is red: nothing tells which one is right.",
        f"max by (server, model, peer_group) (specwatch_peer_agreement{{{peer}}})", "{{peer_group}}: {{server}} {{model}}",
        AGREEMENT_WORDS))

    board = board.with_row(dash.Row("Canary verdicts"))
    board = board.with_panel(graph(
        "Placeholder ratio per endpoint",
        "Fill-in tokens among the canary's tokens after the first, per server and endpoint (cached between canaries).",
        query(f"max by (server, model, endpoint) (specwatch_canary_placeholder_ratio{{{MODEL_MATCH}}})",
            "{{server}} {{model}} {{endpoint}}"),
        unit="percentunit", min_value=0, max_value=1))
    board = board.with_panel(graph(
        "Mean logprob per endpoint",
        "The mean logprob an eval would compute from the canary's answer; fill-ins drag it towards 0.",
        query(f"max by (server, model, endpoint) (specwatch_canary_mean_logprob{{{MODEL_MATCH}}})",
            "{{server}} {{model}} {{endpoint}}"),
        max_value=0))
    board = board.with_panel(graph(
        "Fleet fill-in fraction per endpoint",
        "Fill-in tokens among all canary tokens of the fleet (recording rule).",
        query(f'{Recorded.FILL_IN_TOKEN_RATIO}{{job=~"$job"}}', "{{job}} {{endpoint}}"),
        unit="percentunit", min_value=0, max_value=1))
    board = board.with_panel(graph(
        "Draft tokens per canary",
        "Tokens the server drafted for the canary (timings.draft_n): non-zero means speculation is in use.",
        query(f"max by (server, model, endpoint) (specwatch_canary_draft_tokens{{{MODEL_MATCH}}})",
            "{{server}} {{model}} {{endpoint}}"),
        min_value=0))

    board = board.with_row(dash.Row("Canary and poll health"))
    board = board.with_panel(graph(
        "Canary success per endpoint", "1 when the last canary of the endpoint completed and could be classified.",
        query(f"min by (server, model, endpoint) (specwatch_canary_success{{{MODEL_MATCH}}})",
            "{{server}} {{model}} {{endpoint}}"),
        min_value=0, max_value=1))
    board = board.with_panel(graph(
        "Canary latency per endpoint", "Wall time of the last canary request.",
        query(f"max by (server, model, endpoint) (specwatch_canary_duration_seconds{{{MODEL_MATCH}}})",
            "{{server}} {{model}} {{endpoint}}"),
        unit="s", min_value=0))
    board = board.with_panel(graph(
        "Failures per second by reason", "Failed polls and canaries, by the closed set of reasons.",
        query(f"sum by (server, reason) (rate(specwatch_poll_failures_total{{{MATCH}}}[$__rate_interval]))",
              "poll {{server}} {{reason}}"),
        query(f"sum by (server, endpoint, reason) (rate(specwatch_canary_failures_total{{{MODEL_MATCH}}}[$__rate_interval]))",
              "canary {{server}} {{endpoint}} {{reason}}", ref="B"),
        unit="ops", min_value=0))
    board = board.with_panel(graph(
        "Age of the last successful canary", "Seconds since any endpoint's canary last succeeded, per server.",
        query(f"time() - max by (server, model) (specwatch_canary_last_success_timestamp_seconds{{{MODEL_MATCH}}})",
            "{{server}} {{model}}"),
        unit="s", min_value=0))

    board = board.with_panel(graph(
        "Polls and canaries failing, share", "The share of polls and of canaries that failed (outcome counters exist "
        "from the first probe, so the first failure shows).",
        query(f'sum by (server) (rate(specwatch_polls_total{{{MATCH}, outcome="failure"}}[$__rate_interval])) / '
              f"sum by (server) (rate(specwatch_polls_total{{{MATCH}}}[$__rate_interval]))", "poll {{server}}"),
        query(f'sum by (server, model) (rate(specwatch_canaries_total{{{MODEL_MATCH}, outcome="failure"}}[$__rate_interval]))'
              f" / sum by (server, model) (rate(specwatch_canaries_total{{{MODEL_MATCH}}}[$__rate_interval]))",
              "canary {{server}} {{model}}", ref="B"),
        unit="percentunit", min_value=0, max_value=1))

    board = board.with_row(dash.Row("Routers and llama-server's own counters"))
    board = board.with_panel(merged_table(
        "Router models", "Each model a router lists: loaded (probed) or not (never probed: probing would load it), "
        "and its verdict.",
        {
            "loaded": f"max by (job, server, model) (specwatch_model_loaded{{{MODEL_MATCH}}})",
            "verdict": f"max by (job, server, model) ({verdict_rank(MODEL_MATCH)}) "
                       f"and on (job, server, model) max by (job, server, model) (specwatch_model_loaded{{{MODEL_MATCH}}})",
        },
        height=6,
    ).override_by_name("loaded", [
        model.DynamicConfigValue(id_val="mappings", value=LOADED_WORDS),
    ]).override_by_name("verdict", [
        model.DynamicConfigValue(id_val="mappings", value=VERDICT_WORDS),
        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]))
    board = board.with_panel(graph(
        "Drafted share of generated tokens (llama-server)",
        "From each server's own /metrics (job $llama_job, scraped through specwatch's /sd): the share of generated "
        "tokens that were drafted, i.e. whose logprobs are fill-ins whenever a client asks for logprobs.",
        query(f"max by (server, model) ({Recorded.DRAFTED_SHARE}{{{LLAMA_MATCH}}})",
              "{{server}} {{model}}"),
        unit="percentunit", min_value=0, max_value=1))

    board = board.with_row(dash.Row("Exporters"))
    board = board.with_panel(merged_table(
        "specwatch exporters", "Each exporter's scrape health, version, watched servers and config reload state.",
        {
            "scraped": 'max by (job, instance) (up{job=~"$job"})',
            "version": 'max by (job, instance, version) (specwatch_build_info{job=~"$job"})',
            "servers": 'max by (job, instance) (specwatch_servers{job=~"$job"})',
            "config reload ok": 'max by (job, instance) (specwatch_config_last_reload_successful{job=~"$job"})',
            "last good reload":
                'max by (job, instance) (specwatch_config_last_reload_success_timestamp_seconds{job=~"$job"}) * 1000',
        },
        hide=("Value #B",), height=6,
    ).override_by_name("last good reload", [model.DynamicConfigValue(id_val="unit", value="dateTimeAsIso")]))
    board = board.with_panel(merged_table(
        "Firing specwatch alerts", "Alerts from alerts/specwatch.rules.yml that fire now.",
        {"firing": 'max by (alertname, severity, job, server) '
                   f'(ALERTS{{alertname=~"{ALERT_PREFIX}.*", alertstate="firing", job=~"$job"}})'},
        height=6))
    return board.build()


def server() -> model.Dashboard:
    board = (base(SERVER_UID, "specwatch / server",
                  "One llama-server: its canary verdict per endpoint, speculation as /props and /slots report it, "
                  "and specwatch's probes of it.")
             .with_variable(datasource_variable()).with_variable(job_variable()).with_variable(server_variable(many=False))
             .with_variable(model_variable()).with_variable(llama_job_variable()))
    board = board.with_row(dash.Row("Now"))
    board = board.with_panel(big_number(
        "Verdict", f"max({verdict_rank(MODEL_MATCH)})",
        "The verdict alerts and specwatch check use: clean, unchecked, unproven or FILL_INS.", mappings=VERDICT_WORDS,
        thresholds=steps((None, "green"), (1, "orange"), (2, "yellow"), (3, "red"))))
    board = board.with_panel(big_number(
        "Logprobs", f"max(specwatch_serving_placeholders{{{MODEL_MATCH}}})",
        "Whether the last successful canary found fill-in logprobs on any endpoint.", mappings=SERVING_WORDS,
        thresholds=steps((None, "green"), (1, "red"))))
    board = board.with_panel(big_number(
        "Poll", f"max(specwatch_up{{{MATCH}}})", "Whether the last poll of /health, /props and /slots succeeded.",
        mappings=UP_WORDS, thresholds=steps((None, "red"), (1, "green"))))
    board = board.with_panel(big_number(
        "Speculation (/slots)", f'max(specwatch_speculation_enabled{{{MODEL_MATCH}, source="slots"}})',
        "Speculative decoding as /slots reports it: the truth.", mappings=ON_OFF_WORDS, width=3,
        thresholds=steps((None, "green"), (1, "orange"))))
    board = board.with_panel(big_number(
        "Speculation (/props)", f'max(specwatch_speculation_enabled{{{MODEL_MATCH}, source="props"}})',
        "Speculative decoding as /props reports it: 'off' on every current llama-server.", mappings=ON_OFF_WORDS, width=3,
        thresholds=steps((None, "green"), (1, "orange"))))
    board = board.with_panel(big_number(
        "Last good canary", f"time() - max(specwatch_canary_last_success_timestamp_seconds{{{MODEL_MATCH}}})",
        "Seconds since any endpoint's canary last succeeded.", unit="s", width=3,
        thresholds=steps((None, "green"), (150, "orange"))))
    board = board.with_panel(big_number(
        "Slots", f"max(specwatch_slots{{{MODEL_MATCH}}})", "Parallel sequences the server runs.", width=3,
        thresholds=steps((None, "blue"))))
    board = board.with_panel(merged_table(
        "Build and model", "What the server reports in /props.",
        {"model": f"max by (server, build, model) (specwatch_server_info{{{MODEL_MATCH}}})",
         "last good poll": f"max by (server) (specwatch_last_poll_success_timestamp_seconds{{{MATCH}}}) * 1000"},
        hide=("Value #A",), height=4,
    ).override_by_name("last good poll", [model.DynamicConfigValue(id_val="unit", value="dateTimeAsIso")]))

    board = board.with_row(dash.Row("Canary verdict per endpoint"))
    board = board.with_panel(timeline(
        "Verdict", "The verdict over time.", f"max by (server, model) ({verdict_rank(MODEL_MATCH)})",
            "{{server}} {{model}}", VERDICT_WORDS,
        height=4))
    board = board.with_panel(timeline(
        "Serving fill-ins", "Whether the last successful canary found fill-in logprobs.",
        f"max by (server, model) (specwatch_serving_placeholders{{{MODEL_MATCH}}})",
            "{{server}} {{model}}", SERVING_WORDS, height=4))
    per_endpoint = "max by (job, server, model, endpoint) ({metric}{{" + MODEL_MATCH + "}})"
    fill_ins = f"clamp_max({per_endpoint.format(metric='specwatch_canary_placeholder_tokens')}, 1) * 2"
    drafted = f"clamp_max({per_endpoint.format(metric='specwatch_canary_draft_tokens')}, 1)"
    board = board.with_panel(merged_table(
        "Endpoints", "Per endpoint, what its last successful canary showed: fill-ins, or real logprobs while the server "
        "drafted (a build that fixes the speculative path), or real logprobs without drafting. A fleet on a fixed build "
        "shows 'drafted, logprobs real', not merely quiet.",
        {
            "state": f"max by (model, endpoint) (({fill_ins} + {drafted}) or {fill_ins})",
            "fill-ins": f"max by (model, endpoint) ({per_endpoint.format(metric='specwatch_canary_placeholder_tokens')})",
            "tokens judged": f"max by (model, endpoint) ({per_endpoint.format(metric='specwatch_canary_tokens')})",
            "drafted": f"max by (model, endpoint) ({per_endpoint.format(metric='specwatch_canary_draft_tokens')})",
        },
        height=8,
    ).override_by_name("state", [
        model.DynamicConfigValue(id_val="mappings", value=ENDPOINT_WORDS),
        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
    ]))
    board = board.with_panel(graph(
        "Placeholder ratio", "Fill-in tokens among the canary's tokens after the first.",
        query(f"max by (model, endpoint) (specwatch_canary_placeholder_ratio{{{MODEL_MATCH}}})", "{{model}} {{endpoint}}"),
        unit="percentunit", min_value=0, max_value=1))
    board = board.with_panel(graph(
        "Mean logprob", "The mean an eval would compute from the canary's answer.",
        query(f"max by (model, endpoint) (specwatch_canary_mean_logprob{{{MODEL_MATCH}}})",
            "{{model}} {{endpoint}}"), max_value=0))
    board = board.with_panel(graph(
        "Canary tokens", "Tokens judged in the canary's answer (those after the first), fill-ins among them, and tokens the "
        "server drafted.",
        query(f"max by (model, endpoint) (specwatch_canary_tokens{{{MODEL_MATCH}}})", "tokens {{model}} {{endpoint}}"),
        query(f"max by (model, endpoint) (specwatch_canary_placeholder_tokens{{{MODEL_MATCH}}})",
            "fill-ins {{model}} {{endpoint}}", ref="B"),
        query(f"max by (model, endpoint) (specwatch_canary_draft_tokens{{{MODEL_MATCH}}})",
            "drafted {{model}} {{endpoint}}", ref="C"),
        min_value=0))
    board = board.with_panel(graph(
        "Speculation, /slots vs /props", "1 on, 0 off; absent when the endpoint does not tell (for example /slots disabled).",
        query(f"max by (model, source) (specwatch_speculation_enabled{{{MODEL_MATCH}}})", "{{model}} /{{source}}"),
        query(f"max by (model) (specwatch_speculation_contradiction{{{MODEL_MATCH}}})", "contradiction {{model}}", ref="B"),
        min_value=0, max_value=1))

    board = board.with_panel(graph(
        "Drafted tokens (llama-server)",
        "From the server's own /metrics (job $llama_job, through specwatch's /sd): drafted tokens per second and their "
        "share of the generated ones.",
        query(f"max by (model) ({Recorded.DRAFTED_RATE}{{{LLAMA_MATCH}}})", "drafted/s {{model}}"),
        query(f"max by (model) ({Recorded.DRAFTED_SHARE}{{{LLAMA_MATCH}}})", "share {{model}}",
              ref="B"),
        min_value=0))

    board = board.with_row(dash.Row("Probes"))
    board = board.with_panel(graph(
        "Canary success", "1 when the endpoint's last canary completed and could be classified.",
        query(f"min by (model, endpoint) (specwatch_canary_success{{{MODEL_MATCH}}})",
            "{{model}} {{endpoint}}"), min_value=0, max_value=1))
    board = board.with_panel(graph(
        "Probe latency", "Wall time of the last canary per endpoint, and of the last poll.",
        query(f"max by (model, endpoint) (specwatch_canary_duration_seconds{{{MODEL_MATCH}}})", "canary {{model}} {{endpoint}}"),
        query(f"max(specwatch_poll_duration_seconds{{{MATCH}}})", "poll", ref="B"), unit="s", min_value=0))
    board = board.with_panel(graph(
        "Failures per second by reason", "Failed polls and canaries, by the closed set of reasons.",
        query(f"sum by (reason) (rate(specwatch_poll_failures_total{{{MATCH}}}[$__rate_interval]))", "poll {{reason}}"),
        query(f"sum by (endpoint, reason) (rate(specwatch_canary_failures_total{{{MODEL_MATCH}}}[$__rate_interval]))",
              "canary {{endpoint}} {{reason}}", ref="B"),
        unit="ops", min_value=0))
    board = board.with_panel(graph(
        "Canary tokens per hour", "Tokens the canaries made this server generate, per hour: the price of watching it.",
        query(f"sum by (model) (rate(specwatch_canary_generated_tokens_total{{{MODEL_MATCH}}}[$__rate_interval])) * 3600",
              "generated {{model}}"),
        query(f"sum by (model) (rate(specwatch_canary_requested_tokens_total{{{MODEL_MATCH}}}[$__rate_interval])) * 3600",
              "requested {{model}}", ref="B"),
        min_value=0))
    return board.build()


def numbered(board: model.Dashboard) -> model.Dashboard:
    """Stable panel ids in layout order, so links to a single panel (viewPanel=N) survive regeneration."""
    for number, panel in enumerate(board.panels or [], start=1):
        panel.id_val = number
    return board


DASHBOARDS = {"specwatch-fleet.json": fleet, "specwatch-server.json": server}


def render(build: object) -> str:
    return json.dumps(numbered(build()), cls=JSONEncoder, indent=2, sort_keys=False) + "\n"  # type: ignore[operator]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write the JSON files to (default: dashboards/)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed JSON file differs from the code")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        text = render(build)
        target = args.out / name
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            target.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date, run python dashboards/generate.py: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
