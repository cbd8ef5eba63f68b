"""engine.cpu_isa: a CPU worker's kernels capped to an older instruction set, recorded in its provenance, and
workers of different instruction sets in one run as drift (docs/nondeterminism.md "Instruction sets")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evalrun.audit.verify import verify_run
from evalrun.config import CPU_ISA_LEVELS, load
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline import cpu_isa
from evalrun.pipeline.provenance import drift
from evalrun.pipeline.runner import execute, open_for, prepare, worker_spec
from evalrun.report.data import gather_run
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni sha_ni
processor\t: 1
flags\t\t: fpu sse
"""


def test_every_level_the_config_accepts_has_its_settings() -> None:
    assert cpu_isa.LEVELS == (cpu_isa.NATIVE, *cpu_isa.ENVIRONMENT) == CPU_ISA_LEVELS
    assert set(cpu_isa.ATEN_CAPABILITY) == set(cpu_isa.ENVIRONMENT)
    assert cpu_isa.environment("native") == {}
    assert cpu_isa.environment("avx2")["ATEN_CPU_CAPABILITY"] == "avx2"


def test_a_list_gives_each_worker_its_level_in_turn() -> None:
    assert [cpu_isa.for_worker(("native", "avx2"), i) for i in range(5)] == ["native", "avx2"] * 2 + ["native"]
    assert cpu_isa.for_worker(("default",), 3) == "default"
    assert load(["engine.cpu_isa=[native,avx2]", "cluster.num_workers=2"]).engine.cpu_isa_levels() == (
        "native", "avx2")  # fmt: skip
    assert load([]).engine.cpu_isa_levels() == ("native",) and not load([]).engine.capped()


def test_the_flags_that_choose_kernels_are_read_from_the_first_processor() -> None:
    assert cpu_isa.cpu_flags(CPUINFO) == ["avx", "avx2", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "f16c",
                                          "fma", "sse4_2"]  # fmt: skip
    assert cpu_isa.cpu_flags("") == []


def test_the_vllm_kernel_library_is_read_from_the_process_maps() -> None:
    line = "7f00-7f10 r-xp 00000000 08:01 12 /work/.venv/lib/python3.11/site-packages/vllm/{}.abi3.so"
    assert cpu_isa.vllm_kernels(line.format("_C_AVX2")) == "_C_AVX2"
    assert cpu_isa.vllm_kernels("\n".join([line.format("_C"), line.format("_C")])) == "_C"
    assert cpu_isa.vllm_kernels("\n".join([line.format("_C"), line.format("_C_AVX512")])) == "_C+_C_AVX512"
    assert cpu_isa.vllm_kernels(line.format("_moe_C")) is None and cpu_isa.vllm_kernels("") is None


def test_workers_that_differ_in_instruction_set_drift_on_it() -> None:
    def info(name: str, asked: str, aten: str) -> dict:
        isa = {"asked": asked, "aten": aten, "vllm_kernels": None, "environment": {}}
        hardware = {"machine": "x86_64", "cpu": "AMD EPYC", "cpu_flags": ["avx2"], "isa": isa, "gpu": None}
        return {"worker": name, "hardware": json.dumps(hardware), "engine": {"name": "hf", "version": "1"}}

    found = drift(info("ray-0", "native", "AVX512"), info("ray-1", "avx2", "AVX2"))
    assert [(d.field, d.expected, d.found) for d in found] == [
        ("hardware.isa.asked", "native", "avx2"), ("hardware.isa.aten", "AVX512", "AVX2")]  # fmt: skip
    same = info("ray-1", "native", "AVX512")
    same_hw = json.loads(same["hardware"])
    same_hw["isa"]["environment"] = {"MKL_CBWR": "AVX2"}  # shown in the report, not compared: the level sets it
    assert drift(info("ray-0", "native", "AVX512"), {**same, "hardware": json.dumps(same_hw)}) == []


@pytest.mark.parametrize(
    ("overrides", "named", "expected"),
    [
        (["engine.cpu_isa=avx3"], "engine.cpu_isa", "native | avx512 | avx2 | default"),
        (["engine.cpu_isa=[native,sse2]", "cluster.num_workers=2"], "engine.cpu_isa.1", "native | avx512"),
        (["engine.cpu_isa=[]"], "engine.cpu_isa", "a level"),
        (["engine.cpu_isa=avx2", "cluster=inline"], "engine.cpu_isa", "processes of their own"),
        (["engine=openai", "engine.base_url=http://127.0.0.1:1/v1", "engine.cpu_isa=avx2"], "engine.cpu_isa",
         "and the engine is openai"),
        (["engine=hf", "engine.device=cuda", "engine.cpu_isa=avx2"], "engine.cpu_isa", "engine.device is cuda"),
    ],
)  # fmt: skip
def test_a_cap_that_cannot_act_is_refused_naming_the_field(overrides, named, expected) -> None:
    with pytest.raises(BadInput) as err:
        load(overrides)
    assert err.value.where == named and expected in str(err.value)


def test_a_native_list_inline_is_no_cap_and_runs_as_before() -> None:
    assert not load(["engine.cpu_isa=[native]", "cluster=inline"]).engine.capped()


def test_the_refusal_exits_2_before_any_engine_loads(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "evalrun.cli", "run", f"run.root={tmp_path / 'runs'}",
                             "engine.cpu_isa=avx2", "cluster=inline"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2 and "engine.cpu_isa" in result.stderr and "cluster=inline" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_process_whose_kernels_were_chosen_already_refuses_another_level() -> None:
    """torch picks its ATen kernels once: a level asked for after that cannot act, and says so."""
    code = ("import torch; torch.ones(4).softmax(0); from evalrun.pipeline import cpu_isa; "
            "print(torch.backends.cpu.get_cpu_capability()); cpu_isa.apply('default')")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "engine.cpu_isa=default" in result.stderr and "not DEFAULT" in result.stderr


HETEROGENEOUS = ("engine.cpu_isa=[native,default]", "engine.enforce_eager=true", "cluster.num_workers=2",
                 "cluster.cpus_per_worker=0.5",
                 "cluster.batch_size=2", "limit=8", "determinism.canary=false", "run.progress=false",
                 "report=false")  # fmt: skip


@pytest.mark.e2e
def test_workers_of_two_instruction_sets_stop_a_strict_run_and_are_recorded_under_warn(
    ray_session, tmp_path: Path
) -> None:
    """Two vLLM workers of the tiny model, one native and one capped at ATen's portable kernels (a mixed cluster on
    one machine): each records the kernels it ran with; strict stops before anything is written, naming the capped
    worker and the field; warn records the drift, and the report shows which episodes each instruction set served.
    (``default``, the oldest level, because every x86 processor has it: the native level differs by machine;
    eager, to start without compiling the model.)"""
    import torch

    dispatcher = open_for(prepare(load([f"run.root={tmp_path / 'strict'}", *HETEROGENEOUS])))
    try:
        workers = {w["worker"]: json.loads(w["hardware"])["isa"] for w in dispatcher.workers()}
        native, capped = sorted(workers, key=lambda name: name.startswith("ray-1"))
        assert workers[native]["asked"] == "native" and workers[native]["vllm_kernels"] in cpu_isa.VLLM_LIBRARIES
        assert workers[native]["aten"] == torch.backends.cpu.get_cpu_capability() != "DEFAULT"
        assert workers[capped] == {"asked": "default", "aten": "DEFAULT", "vllm_kernels": "_C_AVX2",
                                   "environment": cpu_isa.environment("default")}  # fmt: skip

        stopped = rf"worker {re.escape(capped)} differs from {re.escape(native)} in hardware\.isa\.asked"
        with pytest.raises(CheckFailed, match=stopped):
            execute(prepare(load([f"run.root={tmp_path / 'strict'}", *HETEROGENEOUS])), dispatcher)
        assert not (tmp_path / "strict").exists() or not any((tmp_path / "strict").iterdir())

        run = execute(prepare(load([f"run.root={tmp_path / 'warn'}", *HETEROGENEOUS, "run.on_drift=warn"])),
                      dispatcher)  # fmt: skip
    finally:
        dispatcher.close()
    manifest = json.loads((run / "manifest.json").read_text())
    fields = {d["field"]: (d["worker"], d["expected"], d["found"]) for d in manifest["drift"]}
    assert fields["hardware.isa.asked"] == (capped, "native", "default")
    assert fields["hardware.isa.aten"] == (capped, workers[native]["aten"], "DEFAULT")
    verify_run(run, jobs=1)

    served = read_outputs(RunDir(run), ["worker"]).column("worker").to_pylist()
    assert set(served) == {native, capped} and len(served) == 8
    (group,) = [g for g in gather_run(run).identity if g.title == "Workers: episodes served"]
    shown = {f.name: f.value for f in group.fields}
    assert shown[f"worker {capped}"].startswith("isa default (aten DEFAULT, vllm kernels _C_AVX2); "
                                                f"{served.count(capped)} episodes")  # fmt: skip
    isa = workers[native]
    assert shown[f"worker {native}"].startswith(f"isa native (aten {isa['aten']}, vllm kernels "
                                                f"{isa['vllm_kernels']}); {served.count(native)} episodes")  # fmt: skip


def test_a_level_the_processor_lacks_is_refused_before_any_engine_loads(monkeypatch) -> None:
    """torch takes ATEN_CPU_CAPABILITY at its word (AVX-512 kernels on a processor without them die of SIGILL):
    workers on this machine are checked against its processor when the config is, exit 2 naming the field."""
    import torch

    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True)
    assert cpu_isa.runs_here() == ("native", "avx2", "default")
    cpu_isa.check_runs_here(("native", "avx2", "default"))
    with pytest.raises(BadInput) as err:
        cpu_isa.check_runs_here(("native", "avx512"))
    assert err.value.where == "engine.cpu_isa" and "has no AVX512" in err.value.message
    assert "native | avx2 | default" in err.value.message
    with pytest.raises(BadInput, match="has no AVX512"):
        worker_spec(load(["engine.cpu_isa=avx512"]))
    with pytest.raises(RuntimeError, match="has no AVX512"):  # a Ray node's worker checks its own processor
        cpu_isa.apply("avx512")
