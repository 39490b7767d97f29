import os

# Tests run beside real server and worker processes on two cores; more than one OpenMP thread
# per process makes them spin against each other (25x slower measured), so one it is.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

pytest_plugins = ["tests.fixtures_models", "tests.fixtures_service", "tests.engine.autoencoders"]


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    """Schemathesis gives every operation's test the function's node id (the operation is in
    the name only); pytest-xdist tells tests apart by node id, and would run one operation
    per fuzz test and drop the rest. Each gets its name's id instead (pytest 9 keeps the id
    in Node._id, pytest 8 in Node._nodeid; test_fuzz_openapi's last test fails if any
    operation went unfuzzed)."""
    for item in items:
        if type(item).__name__ == "SchemathesisFunction" and "[" not in item.nodeid:
            if hasattr(item.parent, "id"):
                item._id = item.parent.id.child(item.name)
            else:  # pytest 8
                item._nodeid = f"{item.parent.nodeid}::{item.name}"


def pytest_report_header(config: object) -> list[str]:
    """Which of PostgreSQL, Redis and Chromium this run has: a green run without CI=true may
    have skipped the browser tests or kept the job table in SQLite, and this says so."""
    from tests.environment import report_lines

    return report_lines()
