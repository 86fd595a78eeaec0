"""One pytest test per wire scenario: beanstalkd 1.12 (the reference) against the target.

The scenarios of the selected tests are played once per session, many at a time (most of a
scenario's wall time is bounded waiting: delays, TTRs, silences), by the session fixture
``differential_outcomes``; each test then checks its own scenario's outcome. The target is tubeq,
or a second beanstalkd with ``--wire-target=beanstalkd`` (the harness's self-check).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest

from tests.differential import (  # noqa: F401  (importing registers the scenarios)
    scenarios_commands,
    scenarios_framing,
    scenarios_parsing,
    scenarios_scheduling,
    scenarios_stats,
)
from tests.differential.harness import (
    SCENARIOS,
    PairFactory,
    ScenarioOutcome,
    ScenarioSpec,
    dump_transcripts,
    new_run_token,
    run_scenarios,
)
from tests.support.servers import ServerProcess

# Playing every scenario takes well under this; the bound only stops a wedged run.
BATCH_TIMEOUT_S = 240


def _params() -> list[object]:
    params: list[object] = []
    for spec in SCENARIOS.values():
        marks = [pytest.mark.differential]
        if spec.quirk:
            marks.append(pytest.mark.quirk)
        if spec.pristine:
            marks.append(pytest.mark.pristine)
        params.append(pytest.param(spec, id=spec.name, marks=marks))
    return params


def _selected_specs(session: pytest.Session) -> list[ScenarioSpec]:
    specs = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and isinstance(callspec.params.get("spec"), ScenarioSpec):
            specs.append(callspec.params["spec"])
    return specs


@pytest.fixture(scope="session")
def differential_outcomes(
    request: pytest.FixtureRequest, beanstalkd: ServerProcess, wire_target: ServerProcess,
    pristine_pair_factory: PairFactory,
) -> dict[str, ScenarioOutcome]:
    """Play every selected scenario once, concurrently, and keep each outcome by name."""
    specs = _selected_specs(request.session)

    def play_all() -> dict[str, ScenarioOutcome]:
        return asyncio.run(run_scenarios(specs, token=new_run_token(), reference=beanstalkd,
                                         target=wire_target, pristine_pair=pristine_pair_factory))

    # A thread of its own: the batch needs an event loop, whatever pytest-asyncio runs here.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        outcomes = pool.submit(play_all).result(timeout=BATCH_TIMEOUT_S)
    dump_path = request.config.getoption("--wire-dump")
    if dump_path:
        Path(dump_path).write_text(dump_transcripts(outcomes.values()))
    return outcomes


@pytest.mark.timeout(BATCH_TIMEOUT_S + 30)
@pytest.mark.parametrize("spec", _params())
def test_scenario(spec: ScenarioSpec, differential_outcomes: dict[str, ScenarioOutcome]) -> None:
    outcome = differential_outcomes[spec.name]
    if outcome.problems():
        pytest.fail(outcome.report(), pytrace=False)
