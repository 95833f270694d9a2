from tests.orchestration.conftest import cluster, fast_settings  # noqa: F401  (shared fixtures)
