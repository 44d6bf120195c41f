"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A private local Ray instance for one test module: 2 CPUs and 4 engine units.

    NOTE: address="local" starts a private instance even while another process's
    ``ray start`` cluster is up on this machine (ray.init would otherwise join it).
    """
    ray = pytest.importorskip("ray")
    from dynbranch.cluster import ENGINE_RESOURCE

    ray.init(address="local", num_cpus=2, resources={ENGINE_RESOURCE: 4},
             include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
