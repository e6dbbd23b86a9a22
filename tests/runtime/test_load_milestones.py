"""The milestones of an engine's load, found in its log: `LogWatch` on written files (lines
cut mid-write, the spawner's own lines, a rotated log, a marker that never comes), and the
spawner reporting them for a real llama-cpp-python server on the tiny model and for the vLLM
stand-in (tests/fixtures/runtime/fake_vllm.py, which prints vLLM's own lines)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cohabit.estimate.estimate import estimate_model
from cohabit.estimate.settings import EngineSettings
from cohabit.runtime.engines import llamacpp, vllm
from cohabit.runtime.interface import EngineState, Milestone
from cohabit.runtime.milestones import LogWatch
from cohabit.runtime.spawner import LOG_NOTE, LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from tests.estimate.tinymodels import write_safetensors_model
from tests.runtime.conftest import fake_launcher, fake_vllm_on_path, launch_request, wait_for

IMP, W = Milestone.ENGINE_IMPORTED, Milestone.WEIGHTS_LOADED
MARKERS = ((IMP, "imported here"), (W, "weights here"))
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def ticking() -> Callable[[], datetime]:
    """A clock one second later at each call: each look's time tells which look saw it."""
    count = itertools.count()
    return lambda: T0 + timedelta(seconds=next(count))


@pytest.mark.parametrize(
    ("writes", "found"),
    [
        pytest.param(["a\nimported here\n", "weights here\n"], [(IMP, 0), (W, 1)], id="two-looks"),
        pytest.param(["imported here\nweights here\n"], [(IMP, 0), (W, 0)], id="one-look"),
        pytest.param(["x imported he", "re y\n"], [(IMP, 1)], id="line-cut-mid-write"),
        pytest.param([f"{LOG_NOTE}imported here\n", "weights here\n"], [(W, 1)], id="our-line"),
        pytest.param(["weights here\nimported here\n"], [(W, 0), (IMP, 0)], id="order-as-seen"),
        pytest.param(["imported here\nimported here\n", "\n"], [(IMP, 0)], id="first-only"),
        pytest.param(["nothing\n", "else\n"], [], id="never-shown"),
    ],
)  # fmt: skip
def test_milestones_are_noted_at_the_look_that_first_finds_their_line(
    tmp_path: Path, writes: list[str], found: list[tuple[Milestone, int]]
) -> None:
    log = tmp_path / "engine.log"
    log.write_text("")
    watch = LogWatch(log, MARKERS, skip=LOG_NOTE, clock=ticking())
    for text in writes:
        with log.open("a") as out:
            out.write(text)
        watch.look()
    assert [(s.milestone, int((s.at - T0).total_seconds())) for s in watch.seen] == found


def test_what_comes_before_the_offset_and_after_a_rotation(tmp_path: Path) -> None:
    """The spawner's lines before the engine's start are not read; a log rotated under the
    watch (its writer's cap) is read again from its start."""
    log = tmp_path / "engine.log"
    log.write_text("starting: imported here\n")
    watch = LogWatch(log, MARKERS, offset=log.stat().st_size)
    watch.look()
    assert watch.seen == ()
    log.rename(tmp_path / "engine.log.1")
    log.write_text("weights\n")  # shorter than what was read
    watch.look()
    log.write_text("weights\nimported here\n")
    watch.look()
    assert [s.milestone for s in watch.seen] == [IMP]
    assert watch.seen[0].line == "imported here"


def test_a_missing_log_is_looked_at_again(tmp_path: Path) -> None:
    watch = LogWatch(tmp_path / "engine.log", MARKERS)
    watch.look()
    (tmp_path / "engine.log").write_text("imported here\n")
    watch.look()
    assert [s.milestone for s in watch.seen] == [IMP]


@pytest.mark.slow
def test_a_real_llama_cpp_server_shows_both_milestones_before_it_answers(
    runtimes: Callable[..., LocalRuntime], tmp_path: Path
) -> None:
    """llama-cpp-python's server on the tiny model: the runtime reports the model loader's
    line, then the context's, each seen at or before the poll that found it READY, and the
    lines are llama.cpp's own (llamacpp.MILESTONES)."""
    model = write_tiny_model(tmp_path / "models" / "tiny.gguf", seed=3)
    runtime = runtimes(startup_timeout_s=60.0)
    request = launch_request("gpu16", 1, engine="llamacpp", model_path=str(model))
    launched = datetime.now(UTC)
    handle = runtime.start(request)
    status = wait_for(runtime, handle, EngineState.READY, EngineState.FAILED, timeout_s=60)
    ready_seen = datetime.now(UTC)
    assert status.state is EngineState.READY, runtime.logs(handle, tail=20)
    assert [s.milestone for s in status.milestones] == [IMP, W]
    imported, weights = status.milestones
    assert launched <= imported.at <= weights.at <= ready_seen
    markers = dict(llamacpp.MILESTONES)
    assert markers[IMP] in imported.line and markers[W] in weights.line
    assert runtime.status(handle).milestones == status.milestones  # kept once READY


def test_the_vllm_stand_in_shows_vllms_own_lines(
    runtimes: Callable[..., LocalRuntime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vllm serve` (the stand-in, printing what GPUModelRunner.load_model logs): both
    milestones, with vLLM's text (vllm.MILESTONES)."""
    fake_vllm_on_path(tmp_path, monkeypatch)
    write_safetensors_model(tmp_path / "m")
    settings = EngineSettings(max_model_len=128)
    request = launch_request(
        "nvidia", 4, engine="vllm", model_path=str(tmp_path / "m"), settings=settings,
        estimate=estimate_model(tmp_path / "m", engine="vllm", settings=settings),
    )  # fmt: skip
    runtime = runtimes()
    handle = runtime.start(request)
    status = wait_for(runtime, handle, EngineState.READY, EngineState.FAILED)
    assert status.state is EngineState.READY, status.error_message
    assert [s.milestone for s in status.milestones] == [IMP, W]
    markers = dict(vllm.MILESTONES)
    assert all(markers[s.milestone] in s.line for s in status.milestones)
    assert status.milestones[0].at <= status.milestones[1].at


def test_an_engine_that_shows_no_milestone_still_starts(
    runtimes: Callable[..., LocalRuntime], model_file: Path
) -> None:
    """An engine whose log has none of the lines (another version, MLX): none reported, and
    it is READY as before."""
    runtime = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = runtime.start(launch_request("nvidia", 4, model_path=str(model_file)))
    status = wait_for(runtime, handle, EngineState.READY, EngineState.FAILED)
    assert status.state is EngineState.READY
    assert status.milestones == ()
