"""Map the hub dataset ``trl-internal-testing/zen`` to local parquet files (``install(zen_dir)``).

``zen_dir/<config>/{train,test}.parquet`` are written by the ``upstream_offline`` plugin. ``install`` wraps
``datasets.load_dataset`` so that this repo id, and only it, loads them through the real ``load_dataset``
(``split=``, ``streaming=`` and the rest work as usual); every other call goes to ``datasets`` untouched.
Used by the plugin and by ``sitecustomize`` in processes the tests start.
"""

from pathlib import Path


ZEN = "trl-internal-testing/zen"
ZEN_CONFIGS = (
    "standard_language_modeling",
    "standard_prompt_only",
    "standard_prompt_completion",
    "standard_preference",
    "standard_implicit_prompt_preference",
    "standard_unpaired_preference",
    "standard_stepwise_supervision",
    "conversational_language_modeling",
    "conversational_prompt_only",
    "conversational_prompt_completion",
    "conversational_preference",
    "conversational_implicit_prompt_preference",
    "conversational_unpaired_preference",
)
_HUB_ONLY_KWARGS = ("revision", "token", "trust_remote_code", "download_mode", "verification_mode")


def install(zen_dir) -> None:
    import datasets
    import datasets.load

    if getattr(datasets.load_dataset, "_upstream_zen", False):
        return
    zen_root = Path(zen_dir)
    real = datasets.load.load_dataset

    def load_dataset(path, name=None, *args, **kwargs):
        if path != ZEN:
            return real(path, name, *args, **kwargs)
        if args:
            raise TypeError(f"upstream_zen: positional arguments after `name` are not mapped for {ZEN}")
        if name not in ZEN_CONFIGS:
            raise ValueError(f"BuilderConfig {name!r} not found in {ZEN}. Available: {list(ZEN_CONFIGS)}")
        files = {split: str(zen_root / name / f"{split}.parquet") for split in ("train", "test")}
        for key in _HUB_ONLY_KWARGS:
            kwargs.pop(key, None)
        return real("parquet", data_files=files, **kwargs)

    load_dataset._upstream_zen = True
    load_dataset.__wrapped__ = real
    datasets.load_dataset = load_dataset
    datasets.load.load_dataset = load_dataset
