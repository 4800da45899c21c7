"""Where a ``--pretrain`` hub id can come from without waiting on a network that is not there."""

from __future__ import annotations


def cached_on_disk(repo_id: str) -> bool:
    """True when the Hugging Face cache holds ``repo_id``'s config (then it loads without the hub)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the Hugging Face hub answers within ``timeout`` seconds (False in offline mode)."""
    import requests
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        requests.head(constants.ENDPOINT, timeout=timeout)
    except requests.RequestException:
        return False
    return True
