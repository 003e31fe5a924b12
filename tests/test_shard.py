"""Sharding: every server watched by exactly one replica, by its peer group or name alone, as Prometheus' hashmod assigns it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from specwatch.daemon.run import shard_of
from specwatch.daemon.shard import hashmod, select, shard_key
from specwatch.settings.schema import Settings
from tests.support.chain import http_ok
from tests.support.net import free_port
from tests.support.process import Process
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
NAMES = [f"llama-{i:04d}" for i in range(300)] + ["", "eval-a", "ünïcode-名前", "x" * 200, 'quote"and\\slash']
SETTINGS_NAMES = [n for n in NAMES if n]  # a configured name is never empty

# MD5 test vectors from RFC 1321, appendix A.5; Prometheus' hashmod reads the digest's last 8 bytes big-endian.
RFC1321 = {
    "": "d41d8cd98f00b204e9800998ecf8427e",
    "a": "0cc175b9c0f1b6a831c399e269772661",
    "abc": "900150983cd24fb0d6963f7d28e17f72",
    "message digest": "f96b697d7cb7938d525a2f31aaf161d0",
}


def watched_servers(settings: Settings, shard: str | None = None) -> list:
    return shard_of(list(settings.servers), shard or settings.shard)


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(servers=[{"name": n, "url": f"http://10.0.{i // 250}.{i % 250}:8080"} for i, n in enumerate(SETTINGS_NAMES)])


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16])
def test_shards_partition_the_fleet(settings: Settings, count: int) -> None:
    shards = [[s.name for s in watched_servers(settings, f"{index}/{count}")] for index in range(count)]
    everyone = [name for shard in shards for name in shard]
    assert sorted(everyone) == sorted(SETTINGS_NAMES), "a server is missing or watched twice"
    assert len(set(everyone)) == len(everyone)
    if count > 1:
        expected = len(SETTINGS_NAMES) / count
        assert all(0.5 * expected <= len(shard) <= 1.5 * expected for shard in shards), [len(s) for s in shards]


def test_config_key_and_flag_pick_the_same_share(settings: Settings) -> None:
    from_flag = watched_servers(settings, "2/3")
    from_config = watched_servers(Settings(servers=[s.model_dump() for s in settings.servers], shard="2/3"))
    assert [s.name for s in from_flag] == [s.name for s in from_config]
    assert watched_servers(settings, None) == list(settings.servers)


def test_assignment_depends_only_on_the_name() -> None:
    fleet = [{"name": n, "url": f"http://a-{i}:8080", "labels": {"pool": "a"}} for i, n in enumerate(SETTINGS_NAMES)]
    moved = [{"name": n, "url": f"https://b-{i}:9999", "labels": {"pool": "b", "zone": "z"}}
             for i, n in enumerate(SETTINGS_NAMES)]
    random.Random(7).shuffle(moved)
    before, after = Settings(servers=fleet), Settings(servers=moved)
    for index in range(5):
        assert {s.name for s in watched_servers(before, f"{index}/5")} == {s.name for s in watched_servers(after, f"{index}/5")}


@pytest.mark.parametrize("count", [2, 3, 7])
def test_a_configured_peer_group_is_watched_whole_by_one_shard(count: int) -> None:
    # Replicas of a pool compared with each other must meet in one exporter: the group, not the name, picks the shard.
    pools = {f"pool-{p}": [f"pool-{p}-replica-{r}" for r in range(5)] for p in range(6)}
    fleet = [{"name": n, "url": f"http://{n}:8080", "peer_group": group} for group, names in pools.items() for n in names]
    fleet += [{"name": n, "url": f"http://{n}:8080"} for n in SETTINGS_NAMES[:30]]
    fleet += [{"name": "opted-out", "url": "http://opted-out:8080", "peer_group": "none"}]
    settings = Settings(servers=fleet)
    shards = {index: {s.name for s in watched_servers(settings, f"{index}/{count}")} for index in range(count)}
    for group, names in pools.items():
        holding = [index for index, watched in shards.items() if set(names) <= watched]
        assert holding == [hashmod(group, count)], f"{group} is split or misplaced: {shards}"
    for name in [*SETTINGS_NAMES[:30], "opted-out"]:
        assert [index for index, watched in shards.items() if name in watched] == [hashmod(name, count)]
    assert sum(len(w) for w in shards.values()) == len(fleet)


def test_the_shard_key_is_the_group_unless_opted_out() -> None:
    assert shard_key("eval-a", "eval") == "eval"
    assert shard_key("eval-a", None) == "eval-a"
    assert shard_key("eval-a", "none") == "eval-a"


@pytest.mark.real
def test_assignment_is_the_same_in_a_fresh_process() -> None:
    """No per-process salt (such as Python's string hash seed) may move a server to another replica after a restart."""
    script = (
        "import json, sys\n"
        "from specwatch.daemon.shard import hashmod\n"
        "names = json.load(sys.stdin)\n"
        "print(json.dumps([hashmod(n, m) for n in names for m in (2, 3, 5, 1000)]))\n"
    )
    here = [hashmod(n, m) for n in NAMES for m in (2, 3, 5, 1000)]
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], input=json.dumps(NAMES), capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=60, check=True)
        assert json.loads(done.stdout) == here


@pytest.mark.parametrize("text", sorted(RFC1321))
def test_hashmod_is_md5_low_eight_bytes_big_endian(text: str) -> None:
    low_bytes = int(RFC1321[text][16:], 16)
    for modulus in (1, 2, 3, 7, 10, 1000, 2**32 + 15):
        assert hashmod(text, modulus) == low_bytes % modulus
    # One figure by hand: 0xd6963f7d28e17f72 is 15462616177412505458, which ends in 458.
    assert hashmod("abc", 1000) == 458


def test_select_keeps_the_fleet_order() -> None:
    chosen = select(NAMES, lambda n: n, 1, 3)
    assert chosen == [n for n in NAMES if hashmod(n, 3) == 1]


@pytest.mark.real
def test_check_config_lists_only_the_replica_share(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump({"servers": [{"name": n, "url": f"http://10.1.0.{i}:8080"} for i, n in
                                                  enumerate(SETTINGS_NAMES[:40])]}), encoding="utf-8")
    listed: list[str] = []
    for index in range(3):
        done = subprocess.run([sys.executable, "-m", "specwatch", "run", "--config", str(config), "--check-config",
                               "--shard", f"{index}/3"], capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
        names = [line.split(":", 1)[0].strip() for line in done.stdout.splitlines() if line.startswith("  ")]
        assert names == [n for n in SETTINGS_NAMES[:40] if hashmod(n, 3) == index]
        listed += names
    assert sorted(listed) == sorted(SETTINGS_NAMES[:40])


@pytest.mark.real
def test_prometheus_hashmod_relabelling_assigns_the_same_shards(tmp_path: Path) -> None:
    """Real Prometheus relabels a target per peer group or name; its shard label must be specwatch's shard for it."""
    modulus = 3
    names = SETTINGS_NAMES[:60]
    grouped = {name: {"peer_group": f"pool-{i % 4}"} for i, name in enumerate(names[:20])}
    port = free_port()
    config = {
        "global": {"scrape_interval": "1h", "scrape_timeout": "1s"},
        "scrape_configs": [{
            "job_name": "fleet",
            "static_configs": [{"targets": [f"127.0.0.1:{9 + i}"], "labels": {"server": name, **grouped.get(name, {})}}
                               for i, name in enumerate(names)],
            # The shard key: the peer group where one is set, else the server's name (docs/sharding.md).
            "relabel_configs": [
                {"source_labels": ["server"], "target_label": "__tmp_key", "action": "replace"},
                {"source_labels": ["peer_group"], "regex": "(.+)", "target_label": "__tmp_key", "action": "replace"},
                {"source_labels": ["__tmp_key"], "modulus": modulus, "target_label": "__tmp_shard", "action": "hashmod"},
                {"source_labels": ["__tmp_shard"], "target_label": "shard", "action": "replace"},
            ],
        }],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    prometheus = Process("prometheus", [
        "/usr/bin/prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ], tmp_path)
    try:
        prometheus.start()
        wait_until("Prometheus to be ready", lambda: http_ok(f"http://127.0.0.1:{port}/-/ready"), timeout=30,
                   processes=[prometheus])

        def targets() -> dict[str, int] | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets?state=active", timeout=5) as answer:
                active = json.loads(answer.read())["data"]["activeTargets"]
            found = {t["labels"]["server"]: int(t["labels"]["shard"]) for t in active}
            return found if len(found) == len(names) else None

        assigned = wait_until("Prometheus to list every relabelled target", targets, timeout=30, processes=[prometheus])
    finally:
        prometheus.stop()
    assert assigned == {name: hashmod(shard_key(name, grouped.get(name, {}).get("peer_group")), modulus) for name in names}

