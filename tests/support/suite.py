"""How the suite is split: tier markers, tests that need PostgreSQL, the serial phase, and the
slowest tests that start first. Applied by the root conftest's collection hook; see
docs/testing.md ("Running the tests").

Entries name tests by their path under tests/ and, after `::`, a test function's name (every
parametrization of it, or one with its `[id]`); a path alone names every test in that file. A
unit test (tests/unit/test_suite_layout.py) checks that every entry still names a test that
exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent

# The first folder under tests/ is a test's tier, and its marker.
TIERS = {
    "unit": "pure code, no socket, no database",
    "contract": "one contract suite run unchanged against every backend or transport",
    "integration": "real servers, databases and sockets in the test's process",
    "acceptance": "real `bullpen` processes, driven as a user would",
    "authz": "the authorization matrix and the API world",
    "fuzz": "schemathesis against the OpenAPI document",
    "faults": "killed, paused and cut-off processes, overload and soak",
    "e2e": "the web UI and the docs in a real Chromium",
    "bench": "the bench tooling",
}

# Tests that measure time, memory or latency (an upper bound on how long something takes, a
# memory, RSS or descriptor bound, a throughput window) or that stop PostgreSQL itself. They run
# in the serial phase, alone on the machine, after the parallel one: under four workers on two
# cores a 100 ms bound measures the neighbours, not the code.
SERIAL = (
    # PostgreSQL stopped and started, overload shed within bounds, the soak. The poison run,
    # the paused worker and the partition (through a proxy of its own) prove what is lost or
    # written, not how soon: they run in the parallel phase, mostly waiting on their workers.
    # The SIGKILL storm too must finish 2,000 runs within the lease + 60 s after its last kill:
    # on PostgreSQL, started first beside both fuzz runs, it left 826 runs undone in CI on
    # 2026-12-06 (and passed alone and in the run before). On SQLite its one worker must be
    # caught mid-run by a kill every 5 s: beside other tests its restart took longer than
    # that, and no kill caught a run in flight.
    "faults/test_overload.py",
    "faults/test_soak.py",
    "faults/test_worker_faults.py::test_sigterm_lets_inflight_runs_finish_then_exits_0",
    "faults/test_worker_faults.py::test_sigterm_past_the_grace_releases_runs_to_another_worker",
    "faults/test_worker_faults.py::test_a_noisy_neighbour_does_not_stretch_another_workspaces_wait",
    "faults/test_worker_faults.py::test_postgres_restarts_under_load_lose_nothing",
    "faults/test_worker_faults.py::test_sigkill_storm_loses_and_duplicates_nothing",
    "integration/streams/test_sse_churn.py",  # memory, descriptors, tasks flat over 20,000 cycles
    "integration/security/test_login_burst.py",  # RSS and /healthz latency during 300 sign-ins
    "integration/security/test_login_throttle.py::test_unknown_email_costs_the_same_time_as_a_wrong_password",
    # Needs its third stream opened before the task it holds a stream of ends (a ~30 ms run):
    # slower, the task's stream closes, the third is admitted and read forever.
    "integration/streams/test_workspace_stream.py::test_workspace_streams_count_against_the_limits",
    "integration/gateway/test_gateway_faults.py::test_failures_before_content_fall_back",  # < 1 s
    "integration/gateway/test_gateway_ledger.py::test_rows_arriving_during_a_commit_are_committed_next_not_later",
    "integration/gateway/test_gateway_ledger.py::test_rows_of_calls_ending_within_the_linger_commit_together",
    "integration/gateway/test_gateway_ledger.py::test_the_apps_ledger_lingers_as_configured",
    "integration/api/test_api_task_actions.py::test_cancel_a_running_task_stops_it_within_a_second",
    "integration/queue/test_queue_api.py::test_cancel_reaches_a_worker_in_another_process_within_a_second",
    "integration/gateway/test_simprovider.py::test_client_disconnect_mid_stream_leaves_the_server_serving",
    "integration/gateway/test_simprovider.py::test_first_token_waits_for_ttft_and_tokens_follow_the_rate",
    "integration/gateway/test_simprovider.py::test_hang_sends_sse_headers_then_nothing_and_frees_the_server",
    "integration/agents/test_process_agent.py::test_text_streams_without_waiting_for_a_newline_and_cancel_ends_the_group",
    "integration/agents/test_process_agent.py::test_a_large_context_the_command_never_reads_does_not_block",
    "integration/agents/test_process_agent.py::test_a_timeout_ends_the_whole_group",
    "integration/agents/test_process_agent.py::test_a_group_that_ignores_sigterm_gets_sigkill_after_the_grace",
    "integration/agents/test_process_agent.py::test_what_a_successful_command_leaves_running_is_killed",
    "integration/agents/test_process_agent.py::test_a_process_that_left_the_group_cannot_hold_the_run",
    "integration/agents/test_process_agent.py::test_an_events_sink_that_fails_ends_the_run_with_its_error",
    "e2e/test_ui.py::test_task_streams_into_its_page",  # the page sees the stream live
    # Some text must reach the run before the answer passes 64 KiB: under load the client's
    # first read can hold the whole 100 KB, and then no text came first.
    "integration/agents/test_http_agent.py::test_an_answer_over_its_limit_fails_the_run",
    "bench/test_loadgen.py",  # wall time and completion time windows
    "bench/test_streamsbench.py",  # tokens per second within a window
    "bench/test_relaybench.py",  # first content within 15 ms; the scenario's timings
    # Budgets hold to a slice per call only while a read carries a few tokens: on a starved
    # loop one read carried 70-100 (measured), whatever the reservation's speed.
    "integration/gateway/test_relay_budgets.py::test_concurrent_relay_streams_never_pass_a_budget_by_more_than_a_slice_each",
    # Each waits at most 30 s for a thousand-task chain's cancel to reach every level: in the
    # clean-clone run of 2026-12-06 9 runs were still open at the deadline (passes alone in 7 s).
    "integration/api/test_task_trees.py::test_cancelling_a_chain_of_a_thousand_cancels_every_level",
    # Failed once in the same run (a reader inside the open write transaction was not held
    # back); passes alone. Left here to be looked into without four workers beside it.
    "integration/store/test_task_changes.py::test_another_databases_open_transaction_does_not_hold_a_reader_back",
    # The same bound for agents' runs: in two full runs on 2026-12-06 a starved loop charged
    # 55-142 output tokens a call against a 16-token slice (it passes alone).
    "integration/agents/test_spend.py::test_concurrent_runs_never_spend_past_a_budget_by_more_than_a_slice_each",
    "faults/test_worker_faults.py::test_a_worker_killed_mid_stream_leaves_no_reservation_and_counts_no_call_twice",
    "faults/test_worker_faults.py::test_two_workers_never_spend_past_a_budget_by_more_than_a_slice_a_call",
)

# Tests that need the PostgreSQL server without a `postgres` parameter saying so.
POSTGRES = (
    "faults/test_partition.py",
    "faults/test_soak.py",
    "bench/test_relaybench.py::test_the_relay_scenario_measures_direct_hop_and_relayed_streams",
)

# The longest tests of the parallel phase, started first so that none begins near the end.
SLOWEST_FIRST = (
    "fuzz/test_fuzz.py",
    "faults/test_worker_faults.py::test_a_poison_run_is_dead_lettered_while_good_runs_complete",
    "faults/test_worker_faults.py::test_a_paused_workers_late_writes_are_refused",
    "faults/test_partition.py",
)


def _rel(item: pytest.Item) -> str:
    return item.path.resolve().relative_to(TESTS).as_posix()


def _matches(item: pytest.Item, entries: Iterable[str]) -> int | None:
    """The index of the first entry naming `item`, if any."""
    rel = _rel(item)
    names = {f"{rel}::{getattr(item, 'originalname', item.name)}", f"{rel}::{item.name}"}
    for i, entry in enumerate(entries):
        if entry in names or rel == entry or rel.startswith(entry.rstrip("/") + "/"):
            return i
    return None


def tier_of(item: pytest.Item) -> str:
    """The tier marker of a test: the first folder under tests/."""
    first = _rel(item).split("/", 1)[0]
    if first not in TIERS:
        raise pytest.UsageError(
            f"{item.nodeid}: a test lives in a tier folder, one of {sorted(TIERS)}"
        )
    return first


def needs_postgres(item: pytest.Item) -> bool:
    """Whether a test needs the PostgreSQL server: a parameter (backend, bus, wire ...) says
    `postgres` or `pgbouncer`, it asks for the template database, or it is listed in POSTGRES."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(
        value in ("postgres", "pgbouncer") for value in callspec.params.values()
    ):
        return True
    if {"pg_template", "pg_available"} & set(getattr(item, "fixturenames", ())):
        return True
    return _matches(item, POSTGRES) is not None


def mark(items: list[pytest.Item]) -> None:
    """Add each test's tier marker, and `postgres` and `serial` where they apply; then put the
    slowest tests first (the order of everything else is kept)."""
    for item in items:
        item.add_marker(tier_of(item))
        if needs_postgres(item):
            item.add_marker("postgres")
        if _matches(item, SERIAL) is not None:
            item.add_marker("serial")
    first = {id(item): _matches(item, SLOWEST_FIRST) for item in items}
    items.sort(key=lambda item: (first[id(item)] is None, first[id(item)] or 0))
