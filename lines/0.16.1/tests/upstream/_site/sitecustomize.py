"""In processes started by the upstream tests (``trl dpo`` -> ``accelerate launch`` -> a script), map the zen
dataset as the ``upstream_offline`` plugin does in the test process. Inert unless TRL_UPSTREAM_ZEN_DIR is set."""

import os


if os.environ.get("TRL_UPSTREAM_ZEN_DIR"):
    import upstream_zen

    upstream_zen.install(os.environ["TRL_UPSTREAM_ZEN_DIR"])
