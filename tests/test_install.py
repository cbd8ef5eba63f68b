"""How a run's software was installed, in its manifest (``install``: the lock file and the container image),
and the cluster recipes naming their image by digest (docs/design.md "Locked installs")."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from evalrun.audit.verify import verify_run
from evalrun.errors import BadInput
from evalrun.pipeline.environment import (
    INSTALL_RECORD,
    PINNED_IMAGE,
    container_image,
    install_provenance,
    installed_lock,
)
from evalrun.records.formats import Install, Manifest
from evalrun.rundir import layout

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
IMAGE = "registry.example.org/evalrun@sha256:" + "3f" * 32
PLACEHOLDER = "${EVALRUN_IMAGE_DIGEST}"
# registry[:port]/path@sha256:DIGEST, the digest written out or the placeholder the recipe's user fills in
RECIPE_IMAGE = re.compile(r"^[a-z0-9.\-]+(?::[0-9]+)?/[a-z0-9._\-/]+@sha256:([0-9a-f]{64}|\$\{EVALRUN_IMAGE_DIGEST\})$")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_install_record(prefix: Path, extra: str, lock: str) -> None:
    """What scripts/setup.sh writes into .venv, made by the script setup.sh runs."""
    done = subprocess.run([sys.executable, "scripts/install_record.py", extra, lock], cwd=ROOT,
                          capture_output=True, text=True, check=True)  # fmt: skip
    (prefix / INSTALL_RECORD).write_text(done.stdout)


# --- the lock -------------------------------------------------------------------------------------


def test_the_lock_setup_installed_is_read_back_with_its_sha256(tmp_path: Path) -> None:
    write_install_record(tmp_path, "cpu", "requirements/cpu.lock")
    lock = installed_lock(tmp_path)
    assert lock == {"extra": "cpu", "path": "requirements/cpu.lock", "sha256": sha256(ROOT / "requirements/cpu.lock")}
    assert install_provenance(tmp_path, environ={}) == {"lock": lock, "image": None}


def test_no_lock_is_claimed_for_an_unlocked_install_or_one_setup_did_not_make(tmp_path: Path) -> None:
    assert installed_lock(tmp_path) is None  # no record: not installed by scripts/setup.sh
    write_install_record(tmp_path, "cpu", "none")  # EVALRUN_LOCK=none
    assert json.loads((tmp_path / INSTALL_RECORD).read_text())["lock"] is None
    assert installed_lock(tmp_path) is None


@pytest.mark.parametrize("text", ["{not json", "[]", '{"extra": "cpu"}', '{"extra": "cpu", "lock": {"path": "x"}}'])
def test_a_damaged_install_record_is_bad_input_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / INSTALL_RECORD).write_text(text)
    with pytest.raises(BadInput, match=re.escape(INSTALL_RECORD)):
        installed_lock(tmp_path)


def test_the_environment_records_the_lock_file_it_was_installed_from() -> None:
    """In an environment scripts/setup.sh made (CI's, `make test`'s), the recorded lock is the file in the
    checkout, byte for byte: setup.sh reinstalls whenever the lock changes."""
    if not (Path(sys.prefix) / INSTALL_RECORD).is_file():
        pytest.skip(f"{sys.prefix} was not installed by scripts/setup.sh")
    lock = installed_lock()
    if lock is None:
        pytest.skip("installed with EVALRUN_LOCK=none")
    assert lock["sha256"] == sha256(ROOT / lock["path"])


# --- the image ------------------------------------------------------------------------------------


def test_the_image_is_recorded_only_when_pinned_by_digest() -> None:
    assert container_image({}) is None and container_image({"EVALRUN_IMAGE": ""}) is None
    assert container_image({"EVALRUN_IMAGE": IMAGE}) == IMAGE
    for unpinned in ("registry.example.org/evalrun:latest", "registry.example.org/evalrun",
                     "registry.example.org/evalrun@sha256:" + PLACEHOLDER, IMAGE[:-1]):  # fmt: skip
        with pytest.raises(BadInput, match="EVALRUN_IMAGE"):
            container_image({"EVALRUN_IMAGE": unpinned})


def test_install_is_an_optional_manifest_field_typed_like_the_rest() -> None:
    assert Install.model_validate({"lock": None, "image": IMAGE}).as_record() == {"lock": None, "image": IMAGE}
    with pytest.raises(ValidationError):
        Install.model_validate({"lock": None, "image": "registry.example.org/evalrun:latest"})
    with pytest.raises(ValidationError):
        Install.model_validate({"lock": {"extra": "cpu", "path": "x.lock", "sha256": "00"}, "image": None})
    golden = json.loads((ROOT / "tests/golden/addition-v1/manifest.json").read_text())
    assert "install" not in golden and Manifest.model_validate(golden).as_record() == golden  # old manifests parse


# --- the cluster recipes --------------------------------------------------------------------------


def _images(value: Any) -> list[tuple[str, Any]]:
    """Every ``image`` in a YAML document, with the mapping that holds it."""
    found = []
    if isinstance(value, dict):
        found += [(value["image"], value)] if "image" in value else []
        for sub in value.values():
            found += _images(sub)
    elif isinstance(value, list):
        for sub in value:
            found += _images(sub)
    return found


def unpinned_images(text: str) -> list[str]:
    """The image references in a recipe that are not pinned by digest, and ``EVALRUN_IMAGE`` settings that
    are not the image beside them."""
    problems = list(re.findall(r"\S+:latest\b", text))
    for image, holder in _images(yaml.safe_load(text)):
        if not RECIPE_IMAGE.match(str(image)):
            problems.append(str(image))
        told = [e.get("value") for e in holder.get("env", []) if e.get("name") == "EVALRUN_IMAGE"]
        told += [o.split("=", 1)[1] for o in holder.get("run_options", []) if o.startswith("--env EVALRUN_IMAGE=")]
        if told != [image]:
            problems.append(f"EVALRUN_IMAGE {told} beside {image}")
    return problems


def test_the_check_of_recipe_images_can_fail() -> None:
    text = (CLUSTER / "rayjob.yaml").read_text()
    assert unpinned_images(text) == []
    latest = text.replace("evalrun@sha256:${EVALRUN_IMAGE_DIGEST}   # replace", "evalrun:latest   # replace")
    assert "registry.example.org/evalrun:latest" in unpinned_images(latest)
    tagged = text.replace("evalrun@sha256:${EVALRUN_IMAGE_DIGEST}   # replace", "evalrun:v1   # replace")
    assert "registry.example.org/evalrun:v1" in unpinned_images(tagged)
    unset = re.sub(r"\n +- \{name: EVALRUN_IMAGE, value: [^\n]*", "", text, count=1)
    assert any(p.startswith("EVALRUN_IMAGE []") for p in unpinned_images(unset))


@pytest.mark.parametrize("recipe", ["rayjob.yaml", "ray-cluster.yaml"])
def test_every_image_a_yaml_recipe_runs_is_pinned_by_digest_and_named_to_evalrun(recipe: str) -> None:
    text = (CLUSTER / recipe).read_text()
    assert _images(yaml.safe_load(text)), f"{recipe} names no image"
    assert unpinned_images(text) == []
    # Once the digest is filled in, what the recipe tells evalrun is what evalrun accepts.
    for image, _ in _images(yaml.safe_load(text)):
        assert PINNED_IMAGE.match(image.replace(PLACEHOLDER, "0" * 64))


def test_the_slurm_recipe_runs_the_image_it_names_to_evalrun() -> None:
    text = (CLUSTER / "slurm.sbatch").read_text()
    (image,) = re.findall(r'^\s*export EVALRUN_IMAGE="([^"]+)"', text, flags=re.MULTILINE)
    assert RECIPE_IMAGE.match(image)
    assert '"docker://$EVALRUN_IMAGE"' in text  # the container run is the one named


def test_no_file_in_cluster_names_an_image_by_tag() -> None:
    for path in sorted(CLUSTER.iterdir()):
        text = path.read_text()
        assert ":latest" not in text, path.name
        assert not re.findall(r"[\w.\-]+/evalrun:(?!\$)[\w.\-]+", text), path.name  # registry/evalrun:TAG


# --- runs -----------------------------------------------------------------------------------------


def _manifest(run: Path) -> dict[str, Any]:
    return json.loads(layout.RunDir(run).manifest.read_text())


def test_a_run_records_its_install_outside_its_identity_and_digest(audit_run: Path, run_eval, monkeypatch) -> None:
    plain = _manifest(audit_run)
    assert plain["install"] == {"lock": installed_lock(), "image": None}
    monkeypatch.setenv("EVALRUN_IMAGE", IMAGE)
    in_image = run_eval("limit=12", "cluster.batch_size=5")  # audit_run's settings
    manifest = _manifest(in_image)
    assert manifest["install"] == {"lock": installed_lock(), "image": IMAGE}
    assert manifest["identity"] == plain["identity"] and manifest["digest"] == plain["digest"]
    assert verify_run(in_image, jobs=1).merkle_root == verify_run(audit_run, jobs=1).merkle_root


def test_an_image_not_pinned_by_digest_stops_the_run_before_it_starts(run_eval, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EVALRUN_IMAGE", "registry.example.org/evalrun:latest")
    with pytest.raises(BadInput, match="EVALRUN_IMAGE"):
        run_eval("limit=1")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_recipes_install_evalrun_from_its_wheel_and_the_lock_never_from_a_checkout() -> None:
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    installs = re.findall(r"pip install [^\n\\]*", dockerfile)
    assert [("--require-hashes" in i, "evalrun-*.whl" in i) for i in installs] == [(True, False), (False, True)]
    assert "COPY . " not in dockerfile  # the wheel and the lock, not the checkout
    assert "/opt/evalrun/evalrun-install.json" in dockerfile  # the manifest's install.lock
    for path in sorted(CLUSTER.iterdir()):
        text = path.read_text()
        assert ".venv" not in text and "scripts/setup.sh" not in text.replace("(scripts/setup.sh and", ""), path.name
