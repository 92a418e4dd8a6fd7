import os

import pytest
from hypothesis import HealthCheck, settings

# Reproducible examples in CI; no deadline, since interpreter timings vary with the machine's load.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def record():
    """The committed H200 results."""
    from preshuffle import report

    return report.load()
