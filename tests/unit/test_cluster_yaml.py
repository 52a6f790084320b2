"""cluster.yaml is a valid Ray cluster launcher config; typos are caught and named offline."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
import yaml

from collage_farm.cli.cluster import add_cluster_parser, check_cluster_config, run_cluster

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "cluster.yaml"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _write(tmp_path: Path, cfg: dict, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return p


def _cli(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    ap = argparse.ArgumentParser()
    add_cluster_parser(ap.add_subparsers(dest="cmd"))
    rc = run_cluster(ap.parse_args(["cluster", "check", str(path)]))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_repo_cluster_yaml_passes_ray_validation(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_cluster_config(CLUSTER_YAML)
    assert report.ok, report.errors
    assert report.warnings == []
    res = report.node_types
    assert any(k.startswith("cpu_slot_") for r in res.values() for k in r)
    assert any(r.get("GPU") for r in res.values())
    assert any(r.get("ethosu_sim") for r in res.values())
    rc, out = _cli(CLUSTER_YAML, capsys)
    assert rc == 0 and "ok" in out


def test_ray_prepare_and_validate_directly(config: dict) -> None:
    """The same private Ray API `ray up` uses accepts the file (pinned ray==2.60.0)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert set(prepared["available_node_types"]) == set(config["available_node_types"])


def test_head_keeps_auth_and_local_dashboard(config: dict) -> None:
    head = " ".join(config["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token" in head
    assert "--dashboard-host=127.0.0.1" in head
    assert "disabled" not in head
    assert any("pip install" in c and "-e ." in c for c in config["setup_commands"])


@pytest.mark.parametrize(
    ("mutate", "key", "hint"),
    [
        (lambda c: c.__setitem__("availble_node_types", c.pop("available_node_types")),
         "availble_node_types", "available_node_types"),
        (lambda c: c["available_node_types"]["cpu_measure"].__setitem__("min_worker", 1),
         "min_worker", "min_workers"),
        (lambda c: c["available_node_types"]["gpu_measure"].__setitem__(
            "resorces", c["available_node_types"]["gpu_measure"].pop("resources")),
         "resorces", "resources"),
        (lambda c: c.__setitem__("idle_timeout_minuts", 5), "idle_timeout_minuts",
         "idle_timeout_minutes"),
    ],
)
def test_typo_fails_naming_the_key(tmp_path: Path, config: dict, mutate, key: str, hint: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = copy.deepcopy(config)
    mutate(cfg)
    path = _write(tmp_path, cfg)
    report = check_cluster_config(path)
    assert not report.ok
    text = " ".join(report.errors)
    assert repr(key) in text and repr(hint) in text
    rc, out = _cli(path, capsys)
    assert rc == 2 and key in out


def test_misspelled_runner_resource(tmp_path: Path, config: dict) -> None:
    cfg = copy.deepcopy(config)
    res = cfg["available_node_types"]["ethosu_sim"]["resources"]
    res["ethos_sim"] = res.pop("ethosu_sim")
    report = check_cluster_config(_write(tmp_path, cfg))
    assert not report.ok and "'ethos_sim'" in " ".join(report.errors)


def test_bad_value_type_and_yaml_syntax(tmp_path: Path, config: dict) -> None:
    cfg = copy.deepcopy(config)
    cfg["max_workers"] = "eight"
    report = check_cluster_config(_write(tmp_path, cfg))
    assert not report.ok and "max_workers" in report.errors[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: x\nprovider: [1,\n")
    report = check_cluster_config(bad)
    assert not report.ok and "line" in report.errors[0]


def test_local_provider_rejects_node_types(tmp_path: Path, config: dict) -> None:
    """FIELD-NOTES: `provider: type: local` does not take available_node_types."""
    cfg = copy.deepcopy(config)
    cfg["provider"] = {"type": "local", "head_ip": "10.0.0.1", "worker_ips": ["10.0.0.2"]}
    report = check_cluster_config(_write(tmp_path, cfg))
    assert not report.ok and "available_node_types" in report.errors[0]


def test_auth_disabled_is_an_error(tmp_path: Path, config: dict) -> None:
    cfg = copy.deepcopy(config)
    cfg["head_start_ray_commands"] = ["ray stop", "RAY_AUTH_MODE=disabled ray start --head "
                                      "--dashboard-host=127.0.0.1"]
    report = check_cluster_config(_write(tmp_path, cfg))
    assert not report.ok and "authentication" in " ".join(report.errors)


def test_llc_domain_resources(tmp_path: Path, config: dict) -> None:
    res = config["available_node_types"]["cpu_measure"]["resources"]
    assert any(k.startswith("cpu_llc_") for k in res)  # the repo's measurement node declares it
    assert check_cluster_config(_write(tmp_path, config)).ok
    cfg = copy.deepcopy(config)
    cfg["available_node_types"]["cpu_measure"]["resources"]["cpu_llc_0-1"] = 1
    report = check_cluster_config(_write(tmp_path, cfg))
    assert not report.ok and "'cpu_llc_0-1' is not an LLC domain resource" in report.errors[0]
