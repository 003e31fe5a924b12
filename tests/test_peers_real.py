"""Replicas compared on real llama-servers of a generated model: which agree, which differ and how, as the daemon, the
gate and check see it (tests/test_peers_gemma.py does the same on a real trained model, whose numbers batching moves).

One pool of real servers under one alias, started once for the module (they are only read): two replicas of one file
with other -np/-c/-b, one of them kept busy by other requests while the daemon watches; a draft and an n-gram replica; that file
requantized to Q4_0; another file of the same shape (other weights: only its answers tell); a file of the same name,
shape and words whose cycle runs the other way; and a router serving the pool's file as a model of the same name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from specwatch.demo.llamaserver import LlamaRouter, LlamaServer, router_preset
from specwatch.demo.tinymodel import write_cycle_model
from tests.support.metrics import find, scrape
from tests.support.process import ExporterProcess, check_json
from tests.support.replicas import ALIAS, replica_models
from tests.support.traffic import busy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]

AGREEING = ("plain", "wide", "draft", "ngram", "router")
DISAGREEING = {"requantized": "fingerprint", "other-file": "answers", "same-name": "answers"}


@dataclass
class Pool:
    servers: dict[str, LlamaServer]

    def url(self, name: str) -> str:
        return self.servers[name].url


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    work = tmp_path_factory.mktemp("replicas")
    models = replica_models(work)
    (work / "elsewhere").mkdir()
    same_name = write_cycle_model(work / "elsewhere" / models.plain.name, tensor_type="Q8_0",
                                  cycle_words=("the", "mat", "a", "on", "sat", "cat"))
    alias = ["-a", ALIAS]
    specs = {
        "plain": (models.plain, alias, 1, 2048),
        "wide": (models.plain, [*alias, "-b", "256", "-ub", "128"], 4, 8192),
        "draft": (models.plain, [*alias, "-md", str(models.plain), "--spec-type", "draft-simple"], 1, 2048),
        "ngram": (models.plain, [*alias, "--spec-type", "ngram-mod"], 1, 2048),
        "requantized": (models.requantized, alias, 1, 2048),
        "other-file": (models.other_file, alias, 1, 2048),
        "same-name": (same_name, alias, 1, 2048),
    }
    servers: dict[str, LlamaServer] = {}
    try:
        for name, (model, extra, parallel, ctx) in specs.items():
            servers[name] = LlamaServer(model, extra, parallel=parallel, ctx_size=ctx, log_dir=work).start()
        router = LlamaRouter(router_preset(work / "preset.ini", {ALIAS: ["--model", str(models.plain)]}), models_max=1,
                             log_dir=work).start()
        servers["router"] = router
        router.load(ALIAS)
        yield Pool(servers)
    finally:
        for server in servers.values():
            server.close()


def test_the_daemon_finds_the_replicas_that_serve_another_model_and_the_gate_refuses_the_pool(pool: Pool,
                                                                                          tmp_path: Path) -> None:
    config = tmp_path / "specwatch.yml"
    lines = [f"  - {{name: {name}, url: '{server.url}', labels: {{pool: eval}}}}" for name, server in pool.servers.items()]
    config.write_text("servers:\n" + "\n".join(lines) + "\npoll_interval: 1s\ncanary_interval: 1s\n", encoding="utf-8")
    # Three other requests decoding on the wide replica all the time (one prompt, 48 tokens each), as an eval would.
    traffic = busy(pool.url("wide"), n_predict=48, prompt=lambda rng: "hello world " * 20, timeout=60)
    with traffic as answered, ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        metrics = f"{exporter.url()}/metrics"
        seen_wide: list[float | None] = []

        def settled() -> dict | None:
            samples = scrape(metrics)
            agreement = {name: find(samples, "specwatch_peer_agreement", server=name, peer_group=ALIAS)
                         for name in pool.servers}
            seen_wide.append(agreement["wide"])
            expected = {**dict.fromkeys(AGREEING, 1.0), **dict.fromkeys(DISAGREEING, 0.0)}
            return agreement if agreement == expected else None

        wait_until("every replica's agreement", settled, timeout=120, interval=0.5, alive=exporter.process)
        # The busy replica never differed, not even for a scrape, while other requests decoded beside its probes.
        assert 0.0 not in seen_wide and answered[0] > 0
        samples = scrape(metrics)
        for name in ("other-file", "same-name"):
            assert find(samples, "specwatch_peer_evidence", server=name, peer_group=ALIAS) == 1.0
        assert find(samples, "specwatch_peer_evidence", server="plain", peer_group=ALIAS) < 0.5
        assert find(samples, "specwatch_model_fingerprint_info", server="requantized", ftype="Q4_0") == 1

        document = httpx.get(f"{exporter.url()}/api/v1/verdicts").json()
        peers = {s["server"]: s["models"][0]["peers"] for s in document["servers"]}
        for name in DISAGREEING:
            assert set(peers[name]["held_against"]) >= {"plain", "wide"}, peers[name]
        for name, kind in DISAGREEING.items():
            assert (peers[name]["agreement"], peers[name]["kind"]) == (False, kind), peers[name]
        assert all(peers[name]["agreement"] is True for name in AGREEING), peers
        # The fill-in judgement is a judgement of its own: the speculating replicas still serve fill-ins.
        verdicts = {s["server"]: s["models"][0]["verdict"] for s in document["servers"]}
        assert verdicts["draft"] == "fill_ins" and verdicts["requantized"] == "clean"

        code, report = check_json("--exporter", exporter.url(), "--label", "pool=eval")
        assert code == 1 and sorted(report["disagreeing"]) == sorted(DISAGREEING)
        code, report = check_json("--exporter", exporter.url(), "--server", "plain", "--server", "wide")
        assert (code, report["verdict"], report["disagreeing"]) == (0, "clean", [])


def test_check_compares_the_servers_it_is_given(pool: Pool) -> None:
    code, report = check_json(pool.url("plain"), pool.url("wide"), pool.url("requantized"), "--tokens", "16")
    assert code == 1 and report["disagreeing"] == [pool.url("requantized")], report["summary"]
    assert "fingerprint" in report["summary"]
    code, report = check_json(pool.url("plain"), pool.url("wide"), pool.url("same-name"), "--tokens", "16")
    assert code == 1 and report["disagreeing"] == [pool.url("same-name")], report["summary"]
    assert report["peers"][pool.url("same-name")]["kind"] == "answers"
    # The n-gram replica serves fill-ins (exit 1 for that) and still emits its plain peers' texts.
    code, report = check_json(pool.url("plain"), pool.url("wide"), pool.url("ngram"), "--tokens", "16",
                              "--endpoint", "completion")
    assert (code, report["verdict"], report["disagreeing"]) == (1, "fill_ins", []), report["summary"]
    assert {entry["agreement"] for entry in report["peers"].values()} == {True}
    code, report = check_json(pool.url("plain"), f"{pool.url('router')}", "--model", ALIAS, "--tokens", "16",
                              "--endpoint", "completion")
    assert (code, report["disagreeing"]) == (0, []), report["summary"]
    assert set(report["peers"]) == {f"{pool.url('plain')}/{ALIAS}", f"{pool.url('router')}/{ALIAS}"}
    assert {entry["agreement"] for entry in report["peers"].values()} == {True}


def test_a_pair_held_to_a_recorded_reference_names_its_odd_member(pool: Pool, tmp_path: Path) -> None:
    import subprocess
    import sys

    ref = tmp_path / "tiny.reference.json"
    done = subprocess.run([sys.executable, "-m", "specwatch", "reference", pool.url("plain"), "--out", str(ref),
                           "--prompts", "40"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "recorded 40 answers" in done.stdout, done.stderr
    config = tmp_path / "specwatch.yml"
    pair = ("wide", "other-file")  # alone, a pair that differs is a split: nothing says which is off
    lines = [f"  - {{name: {name}, url: '{pool.url(name)}'}}" for name in pair]
    config.write_text("servers:\n" + "\n".join(lines) + f"\npoll_interval: 1s\ncanary_interval: 1s\n"
                      f"canary_endpoints: [completion]\npeer_references: {{{ALIAS}: '{ref}'}}\n", encoding="utf-8")
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        metrics = f"{exporter.url()}/metrics"

        def named() -> dict | None:
            samples = scrape(metrics)
            agreement = {n: find(samples, "specwatch_peer_agreement", server=n, peer_group=ALIAS) for n in pair}
            return agreement if agreement == {"wide": 1.0, "other-file": 0.0} else None

        wait_until("the odd member named", named, timeout=120, interval=0.5, alive=exporter.process)
        peers = {s["server"]: s["models"][0]["peers"] for s in httpx.get(f"{exporter.url()}/api/v1/verdicts").json()["servers"]}
        assert not peers["other-file"]["split"] and "from the reference" in peers["other-file"]["detail"]
    # check does the same with --reference: the pair's odd server is named, and one server alone is compared too.
    code, report = check_json(pool.url("wide"), pool.url("same-name"), "--reference", str(ref), "--tokens", "8",
                              "--endpoint", "completion")
    assert (code, report["disagreeing"]) == (1, [pool.url("same-name")]), (report["summary"], report["peers"])
    assert report["peers"][pool.url("wide")]["agreement"] is True
    code, report = check_json(pool.url("wide"), "--reference", str(ref), "--tokens", "8", "--endpoint", "completion")
    assert (code, report["disagreeing"], report["undecided"]) == (0, [], []), report["summary"]
    ref.write_text(ref.read_text()[:100])  # cut short: the daemon refuses to start on it, and says why
    refused = subprocess.run([sys.executable, "-m", "specwatch", "run", "--config", str(config), "--check-config"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "peer_references: " in refused.stderr and "record it again" in refused.stderr
