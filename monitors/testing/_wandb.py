"""wandb's environment for runs that stay on this machine (tests, benchmarks, the load test)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["WANDB_CREDENTIALS", "wandb_offline_env"]

#: Variables that would point a run at someone's account: unset them for a run that must not.
WANDB_CREDENTIALS = ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_NAME")


def wandb_offline_env(home: Path) -> dict[str, str]:
    """The ``WANDB_*`` variables that keep wandb offline and quiet, with no git or code
    capture and no error reports sent.

    :param home: the only folder wandb writes under (its runs, config, cache and data
        folders are created here).
    """
    folders = {
        "WANDB_DIR": home / "runs",
        "WANDB_CONFIG_DIR": home / "config",
        "WANDB_CACHE_DIR": home / "cache",
        "WANDB_DATA_DIR": home / "data",
    }
    for path in folders.values():
        path.mkdir(parents=True, exist_ok=True)
    return {
        "WANDB_MODE": "offline",
        **{name: str(path) for name, path in folders.items()},
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_ERROR_REPORTING": "false",
    }
