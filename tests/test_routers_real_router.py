"""A real llama-server router: check and the daemon see every loaded model's verdict, and never load a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specwatch.demo.llamaserver import LlamaRouter, router_preset
from specwatch.demo.tinymodel import write_cycle_model
from tests.support import builds
from tests.support.builds import PREBUILT
from tests.support.metrics import find, scrape
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaRouter]:
    work = tmp_path_factory.mktemp("router")
    model = write_cycle_model(work / "cycle.gguf")
    preset = router_preset(work / "preset.ini", {
        "plain": ["--model", str(model)],
        "draft": ["--model", str(model), "--model-draft", str(model), "--spec-type", "draft-simple"],
        "cold": ["--model", str(model)],  # never loaded by anyone
    })
    with LlamaRouter(preset, models_max=2, log_dir=work) as started:
        started.load("plain")
        started.load("draft")
        yield started
    # Nothing in this module loaded the cold model, and nothing evicted the loaded ones.


def _check(*args: str) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-m", "specwatch", "check", *args, "--json", "--tokens", "16"],
                            capture_output=True, text=True, timeout=180)
    return result.returncode, json.loads(result.stdout)


def test_check_on_the_router_checks_every_loaded_model(router: LlamaRouter) -> None:
    code, report = _check(router.url)
    assert (code, report["verdict"], report["router"]) == (1, "fill_ins", True)
    models = {m["model"]: (m["status"], m["verdict"]) for m in report["models"]}
    assert models == {"plain": ("loaded", "clean"), "draft": ("loaded", "fill_ins"), "cold": ("unloaded", "unchecked")}
    assert router.status("cold") == "unloaded"


def test_check_of_one_model(router: LlamaRouter) -> None:
    assert _check(router.url, "--model", "plain")[:1] == (0,)
    code, report = _check(router.url, "--model", "draft")
    assert (code, report["verdict"]) == (1, "fill_ins")
    assert all(e["fill_ins"] == 15 for e in report["models"][0]["endpoints"])


def test_check_of_the_unloaded_model_leaves_it_unloaded(router: LlamaRouter) -> None:
    code, report = _check(router.url, "--model", "cold")
    assert (code, report["verdict"]) == (2, "unchecked") and "not loaded" in report["summary"]
    assert router.status("cold") == "unloaded"
    assert {router.status("plain"), router.status("draft")} == {"loaded"}


def test_the_daemon_given_only_the_router_url(router: LlamaRouter, tmp_path: Path) -> None:
    config = tmp_path / "specwatch.yml"
    config.write_text(f"servers:\n  - {{name: router, url: '{router.url}'}}\n"
                      "poll_interval: 1s\ncanary_interval: 2s\n")
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        metrics = f"{exporter.url()}/metrics"

        def verdicts() -> dict[str, str | None]:
            samples = scrape(metrics)
            found = {}
            for model in ("plain", "draft", "cold"):
                on = [v for v in ("clean", "fill_ins", "unproven", "unchecked")
                      if find(samples, "specwatch_verdict", server="router", model=model, verdict=v) == 1]
                found[model] = on[0] if on else None
            return found

        wait_until("the router's verdicts", lambda: verdicts() == {"plain": "clean", "draft": "fill_ins", "cold": "unchecked"}, timeout=60, alive=exporter.process)
        samples = scrape(metrics)
        assert find(samples, "specwatch_model_loaded", server="router", model="cold") == 0
        assert find(samples, "specwatch_model_loaded", server="router", model="draft") == 1
        assert find(samples, "specwatch_speculation_enabled", server="router", model="draft", source="slots") == 1
        assert find(samples, "specwatch_up", server="router") == 1

        sd = httpx.get(f"{exporter.url()}/sd", timeout=10).json()
        target = router.url.removeprefix("http://")
        assert sorted((g["targets"], g["labels"]["model"], g["labels"]["__param_model"], g["labels"]["__param_autoload"])
                      for g in sd) == [([target], "draft", "draft", "false"), ([target], "plain", "plain", "false")]
        clean = httpx.get(f"{exporter.url()}/sd?verdict=clean", timeout=10).json()
        assert [g["labels"]["model"] for g in clean] == ["plain"]
    assert router.status("cold") == "unloaded"  # after the whole run, still never loaded


def _get(router: LlamaRouter, path: str) -> tuple[int, dict]:
    answer = httpx.get(f"{router.url}{path}", timeout=30)
    return answer.status_code, answer.json()


def test_the_router_shapes_specwatch_relies_on(router: LlamaRouter) -> None:
    """docs/llama-server-behaviour.md, "Routers", against the real binary."""
    status, props = _get(router, "/props")
    assert status == 200 and props["role"] == "router" and props["default_generation_settings"]["params"] is None
    status, listing = _get(router, "/models")
    assert {m["id"]: m["status"]["value"] for m in listing["data"]} == {"plain": "loaded", "draft": "loaded",
                                                                       "cold": "unloaded"}
    status, model_props = _get(router, "/props?model=draft&autoload=false")
    assert status == 200 and "role" not in model_props and model_props["model_alias"] == "draft"
    status, slots = _get(router, "/slots?model=draft&autoload=false")
    assert status == 200 and all(slot["speculative"] for slot in slots)
    # autoload=false: a model that is not loaded answers 400 and stays unloaded, for GET and POST alike.
    for method, path, body in (("GET", "/props?model=cold&autoload=false", None),
                               ("POST", "/completion?autoload=false", {"model": "cold", "prompt": "the", "n_predict": 2})):
        answer = httpx.request(method, f"{router.url}{path}", json=body, timeout=30)
        assert (answer.status_code, answer.json()["error"]["message"]) == (400, "model is not loaded")
    assert router.status("cold") == "unloaded"
    # A router's own /metrics needs a model: /sd lists router models, never the bare router.
    status, error = _get(router, "/metrics")
    assert status == 400 and error["error"]["message"] == "model name is missing from the request"


def test_v1_completions_on_a_router_take_the_model_from_the_body(router: LlamaRouter) -> None:
    body = {"prompt": "the cat sat on a mat the cat", "max_tokens": 4, "temperature": 0, "logprobs": 3}
    answer = httpx.post(f"{router.url}/v1/completions?autoload=false", json={**body, "model": "draft"}, timeout=30).json()
    assert answer["model"] == "draft" and answer["choices"][0]["logprobs"]["content"][1]["top_logprobs"] == []
    for model, message in ((None, "model name is missing from the request"), ("cold", "model is not loaded")):
        named = {**body, "stream": True} | ({"model": model} if model else {})
        refused = httpx.post(f"{router.url}/v1/completions?autoload=false&model=draft", json=named, timeout=30)
        assert (refused.status_code, refused.json()["error"]["message"]) == (400, message)
    assert router.status("cold") == "unloaded"


def test_a_router_model_still_loading_answers_503_through_the_router(tmp_path: Path) -> None:
    """/health is the router's own; a model's own loading state shows only through its /props or /slots."""
    model = write_cycle_model(tmp_path / "cycle.gguf")
    fifo = tmp_path / "draft-never-written.gguf"
    os.mkfifo(fifo)  # the child blocks reading its draft model: it stays loading
    preset = router_preset(tmp_path / "preset.ini", {
        "stuck": ["--model", str(model), "--model-draft", str(fifo), "--spec-type", "draft-simple"],
    })
    def answer(path: str) -> tuple[int, object]:
        got = httpx.get(f"{stuck_router.url}{path}", timeout=30)
        try:
            return got.status_code, got.json()
        except ValueError:  # while the child starts, shown as text rather than failing on the decode
            return got.status_code, got.text

    with LlamaRouter(preset, models_max=1, log_dir=tmp_path) as stuck_router:
        httpx.post(f"{stuck_router.url}/models/load", json={"model": "stuck"}, timeout=30).raise_for_status()
        loading = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
        wait_until("the child's 503 through the router", lambda: answer("/props?model=stuck&autoload=false") == (503, loading), timeout=30)
        assert answer("/slots?model=stuck&autoload=false") == (503, loading)
        assert answer("/health?model=stuck&autoload=false") == (200, {"status": "ok"})
        assert stuck_router.status("stuck") == "loading"


@builds.only(PREBUILT)
def test_the_prebuilt_build_has_no_router_mode_and_the_tests_router_refuses_it(tmp_path: Path, build: str) -> None:
    """Why every router test runs on b11434 alone: build 11549's wheel refuses router mode, measured on the wheel itself
    (a --models-preset and no model), and its launcher takes no router flag; LlamaRouter says so before starting."""
    model = write_cycle_model(tmp_path / "cycle.gguf")
    preset = router_preset(tmp_path / "preset.ini", {"plain": ["--model", str(model)]})
    assert builds.prebuilt_router(preset) == \
        "ValueError: params.model.path is required: xllamacpp disabled the router server feature"
    launched = subprocess.run([*builds.get(build).launcher, "--models-preset", str(preset)], capture_output=True,
                              text=True, timeout=120)
    assert launched.returncode == 2 and "the following arguments are required: -m/--model" in launched.stderr
    with pytest.raises(ValueError) as refused:
        LlamaRouter(preset, build=builds.get(build), log_dir=tmp_path)
    assert str(refused.value) == ("llama-server b11549 (prebuilt (xllamacpp==2026.10.11549)) cannot run as a router: its "
                                  "wheel has router mode disabled")
