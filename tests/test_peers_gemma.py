"""Replicas of a real trained model (Gemma 3 270M Q4_K_M) compared, as the daemon and `check` compare them: a busy
4-slot replica (whose numbers batching moves), a speculating one, a renamed file and another build string agree; the
same file with its weights changed a little and one accepting drafts at random (synthetic acceptance) differ; and
behind a real load balancer, what an eval then reads and what the gate says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specwatch.demo.llamaserver import LlamaServer
from tests.support import gemma, haproxy, llamabuild
from tests.support.metrics import find, scrape
from tests.support.process import ExporterProcess, check_json
from tests.support.traffic import busy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]

AGREEING = ("plain", "busy", "drafting", "renamed", "other-build")
DIFFERING = ("changed", "synthetic")
CHANGE = 0.1
"""How much the changed replica's norm weights are scaled (gemma.changed_weights' eps)."""
SLIGHT = ("norms", 0.017, 1)
"""A weight change worth about 0.03 nats to an eval (bench.peer_record's EPS at tuning seed 1): told apart within 10
answers only where the replicas are declared deployed alike."""
SYNTHETIC_DRAFT = 0.5
"""How much the synthetic-acceptance replica's draft has its norm weights scaled."""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, fixed_llama_binary: Path) -> Iterator[dict[str, LlamaServer]]:
    work = tmp_path_factory.mktemp("gemma")
    source = gemma.model()
    renamed = work / "renamed" / "gemma-copy.gguf"
    renamed.parent.mkdir()
    renamed.symlink_to(source)
    # A smaller draft, as speculating replicas have: verified in batches (lossless but for ties and the batch's noise),
    # or accepted unverified (synthetic acceptance: the text is the draft's). A draft that is the model itself proposes
    # the model's own tokens, so its synthetic acceptance would change nothing.
    draft = ("-md", str(gemma.requantized(source, work / "gemma-q4_0.gguf")), "--spec-type", "draft-simple")
    specs: dict[str, tuple[Path, tuple[str, ...], int, dict[str, object]]] = {
        "plain": (source, (), 1, {}),
        "busy": (source, (), 4, {}),
        "drafting": (source, draft, 1, {}),
        "renamed": (renamed, (), 1, {}),
        "other-build": (source, (), 1, {"binary": gemma.relabelled_build(work, fixed_llama_binary), "env": llamabuild.build_env()}),
        # Norms scaled by 1 + 0.1 N(0, 1), about 0.09 nats on an eval: decided in a few rounds. How soon the comparison
        # tells changes of 0.03 nats is bench.peer_power's to measure; every round here keeps a core busy.
        "changed": (gemma.changed_weights(source, work / "changed", CHANGE), (), 1, {}),
        # Synthetic acceptance of a draft far from the model (its norms scaled by 1 + 0.5 N(0, 1)), so that its text
        # parts from the group's within a few rounds. With the Q4_0 draft it took a median of 16 answers held out
        # (bench/README.md), over the 480 s this test can wait at a round every 20 s.
        "slight": (gemma.changed(*SLIGHT, source=source), (), 1, {}),
        "synthetic": (source, ("-md", str(gemma.changed_weights(source, work / "synthetic-draft", SYNTHETIC_DRAFT)),
                               "--spec-type", "draft-simple", "--spec-synth-len", "4"), 1, {}),
    }
    servers: dict[str, LlamaServer] = {}
    try:
        for name, (model, extra, parallel, more) in specs.items():
            servers[name] = LlamaServer(model, ["-a", gemma.ALIAS, *extra], parallel=parallel, ctx_size=2048 * parallel,
                                        log_dir=work, startup_timeout=120, **more).start()  # type: ignore[arg-type]
        yield servers
    finally:
        for server in servers.values():
            server.close()


def test_the_daemon_tells_a_weight_change_and_synthetic_acceptance_from_batching_and_deployment(
        pool: dict[str, LlamaServer], tmp_path: Path) -> None:
    config = tmp_path / "specwatch.yml"
    lines = [f"  - {{name: {name}, url: '{pool[name].url}', labels: {{pool: eval}}}}" for name in (*AGREEING, *DIFFERING)]
    # One peer-probe round a canary_interval, and the canary's timeout is capped by it: on two cores shared with the
    # other tests, the busy replica's canary, batched with three other requests, took over 10 s in CI (at a 10 s
    # interval), and the gate rightly called that replica unchecked. At 20 s it has twice that.
    config.write_text("servers:\n" + "\n".join(lines) + "\npoll_interval: 2s\ncanary_interval: 20s\n"
                      "canary_endpoints: [completion]\n", encoding="utf-8")
    with busy(pool["busy"].url) as answered, ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        metrics = f"{exporter.url()}/metrics"
        seen: list[dict[str, float | None]] = []

        def settled() -> dict | None:
            samples = scrape(metrics)
            agreement = {name: find(samples, "specwatch_peer_agreement", server=name, peer_group=gemma.ALIAS)
                         for name in (*AGREEING, *DIFFERING)}
            seen.append(agreement)
            expected = {**dict.fromkeys(AGREEING, 1.0), **dict.fromkeys(DIFFERING, 0.0)}
            return agreement if agreement == expected else None

        try:
            wait_until("every replica's agreement", settled, timeout=480, interval=0.5, alive=exporter.process)
        except AssertionError as failed:
            found = httpx.get(f"{exporter.url()}/api/v1/verdicts").json()
            said = {s["server"]: s["models"][0]["peers"] for s in found["servers"]}
            raise AssertionError(f"{failed}: last seen {seen[-1]}; peers {json.dumps(said, indent=1)}") from None
        # Three more answers of every replica: the agreeing ones never differ, not even for a scrape. (How often they
        # would over months is bench.peer_power's to measure, on a recording: each round here keeps a core busy.)
        asked = scrape(metrics)
        wait_until("three more peer probes of the busy replica", lambda: (find(
            scrape(metrics), "specwatch_peer_probes_total", server="busy", outcome="success") or 0) >= (find(
            asked, "specwatch_peer_probes_total", server="busy", outcome="success") or 0) + 3, timeout=120,
            interval=1.0, alive=exporter.process)
        settled()
        assert [s for s in seen if any(s[name] == 0.0 for name in AGREEING)] == [] and answered[0] > 0
        samples = scrape(metrics)
        # Its copies decode alike while its other slots are busy, and part now and then: measured, as a mean.
        assert find(samples, "specwatch_peer_noise_nats", server="busy") >= 0.0
        assert find(samples, "specwatch_peer_noise_nats", server="plain") == 0.0  # one slot: nothing batches
        document = httpx.get(f"{exporter.url()}/api/v1/verdicts").json()
        peers = {s["server"]: s["models"][0]["peers"] for s in document["servers"]}
        assert {name: peers[name]["kind"] for name in DIFFERING} == {"changed": "answers", "synthetic": "answers"}
        assert set(peers["changed"]["held_against"]) == set(AGREEING)
        assert peers["other-build"]["deployment"].startswith("build 'b0-patched'")
        assert peers["renamed"]["deployment"].startswith("file 'gemma-copy.gguf'")

        code, report = check_json("--exporter", exporter.url(), "--label", "pool=eval")
        assert code == 1 and sorted(report["disagreeing"]) == sorted(DIFFERING), report["summary"]
        plain = [name for name in AGREEING if name != "drafting"]
        code, report = check_json("--exporter", exporter.url(), *(f"--server={name}" for name in plain))
        assert (code, report["disagreeing"]) == (0, []), report["summary"]
        # The speculating replica agrees with its peers, and serves fill-ins all the same: exit 1 for that alone.
        code, report = check_json("--exporter", exporter.url(), "--server=drafting", "--server=plain")
        assert (code, report["verdict"], report["disagreeing"]) == (1, "fill_ins", []), report["summary"]


def test_check_compares_the_replicas_it_is_given(pool: dict[str, LlamaServer]) -> None:
    code, report = check_json(pool["plain"].url, pool["renamed"].url, pool["other-build"].url, "--tokens", "8",
                              "--endpoint", "completion")
    assert (code, report["disagreeing"], report["undecided"]) == (0, [], []), report["summary"]
    code, report = check_json(pool["plain"].url, pool["renamed"].url, pool["changed"].url, "--tokens", "8",
                              "--endpoint", "completion")
    assert code == 1 and report["disagreeing"] == [pool["changed"].url], report["summary"]
    assert report["peers"][pool["changed"].url]["kind"] == "answers"


def test_check_uniform_tells_a_slight_weight_change_from_batching(pool: dict[str, LlamaServer]) -> None:
    # Declared deployed alike (one build, f16 cache; one and four slots), the lower floor holds the healthy pair
    # together and tells the replica whose norms moved the eval by about 0.03 nats within check's 16 rounds.
    code, report = check_json(pool["plain"].url, pool["busy"].url, pool["renamed"].url, "--uniform", "--tokens", "8",
                              "--endpoint", "completion")
    assert (code, report["disagreeing"], report["undecided"]) == (0, [], []), report["summary"]
    assert "times the noise (0.070)" in report["peers"][pool["busy"].url]["detail"]
    code, report = check_json(pool["plain"].url, pool["busy"].url, pool["slight"].url, "--uniform", "--tokens", "8",
                              "--endpoint", "completion")
    assert code == 1 and report["disagreeing"] == [pool["slight"].url], report["summary"]
    assert report["peers"][pool["slight"].url]["kind"] == "answers"


def test_behind_a_balancer_the_eval_reads_whichever_replica_and_check_never_calls_the_pool_clean(
        pool: dict[str, LlamaServer], tmp_path: Path) -> None:
    from openai import OpenAI

    members = ("plain", "renamed", "changed")
    with haproxy.balancing([pool[name].url for name in members], tmp_path) as balancer:
        client = OpenAI(base_url=f"{balancer}/v1", api_key="unused", max_retries=0, timeout=120)
        for prompt in ("The capital of France is", "Once upon a time,"):
            said = [client.completions.create(model=gemma.ALIAS, prompt=prompt, max_tokens=8, temperature=0,
                                              logprobs=3) for _ in members]
            # llama-server gives a completion's logprobs as chat does (`content`), which the SDK keeps as an extra field.
            numbers = {tuple(t["logprob"] for t in answer.model_dump()["choices"][0]["logprobs"]["content"])
                       for answer in said}
            # Round robin: one ask went to each replica; the two of one file gave one answer, the changed one another.
            assert len(numbers) == 2, [answer.choices[0].text for answer in said]
        code, report = check_json(balancer, "--endpoint", "completion", "--tokens", "8")
        # Its /props changes from one request to the next (each process has its own media marker): never clean.
        assert code == 2 and report["verdict"] == "unchecked" and report["signs"], report["summary"]
        assert "--exporter" in report["summary"]
