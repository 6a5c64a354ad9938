"""What the doctor reads from disk: the draft checkpoint (through eagle3lab.models.checkpoint, the one reader of the
format; headers only, plus d2t/t2d) and the target's config.json (local folder, embedded target or hub cache), and
the one rule for a path that should be on this machine and is not."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.drafters.kinds import DEFAULT, kind_of_config
from eagle3lab.models.checkpoint import DraftCheckpoint, DraftFormatError, open_checkpoint, read_json

# files the doctor or an engine reads: a name ending in one is a file here, never a hub id
LOCAL_SUFFIXES = (".gguf", ".json", ".safetensors")


def missing_local_path(spec: str | Path) -> bool:
    """Whether `spec` is a local path with nothing at it: the one rule for every draft and target the doctor is given
    (--draft, --target, a launch line's model and draft, any engine). A path that does not exist is local when it
    starts with /, . or ~, has more than one /, ends in a file suffix the engines read, or its first folder exists
    here (artifacts/... in a clone); anything else ('org/name', 'name') may be a Hugging Face id."""
    text = str(spec)
    path = Path(text).expanduser()
    if path.exists():
        return False
    return (
        text.startswith(("/", ".", "~"))
        or text.count("/") > 1
        or text.endswith(LOCAL_SUFFIXES)
        or (len(path.parts) > 1 and Path(path.parts[0]).exists())
    )


class DoctorInputError(Exception):
    """An input could not be read; becomes a finding, never a traceback."""


@dataclass
class DraftInfo:
    path: Path
    config: dict
    shapes: dict[str, tuple[list[int], str]]  # normalised key -> (shape, dtype)
    files: list[Path]
    checkpoint: DraftCheckpoint

    def get(self, name: str, default=None):
        return self.config.get(name, default)

    @property
    def hidden_size(self) -> int | None:
        return self.config.get("hidden_size")

    @property
    def target_hidden_size(self) -> int | None:
        # SGLang: hidden_size_in = config.target_hidden_size if present else config.hidden_size
        return self.config.get("target_hidden_size") or self.hidden_size

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def fc_in(self) -> int | None:
        shape = self.shapes.get("fc.weight")
        return shape[0][1] if shape and len(shape[0]) == 2 else None

    @property
    def aux_layer_ids(self) -> list[int] | None:
        eagle = self.config.get("eagle_config") or {}
        return eagle.get("eagle_aux_hidden_state_layer_ids")

    @property
    def vllm_aux_layer_ids(self) -> list[int] | None:
        """The top-level eagle_aux_hidden_state_layer_ids: vLLM reads it before eagle_config's; SGLang never does."""
        return self.config.get("eagle_aux_hidden_state_layer_ids")

    @property
    def drafter_kind(self) -> str:
        """The drafter kind (eagle3lab.drafters) whose checks this draft gets."""
        return kind_of_config(self.config)

    @property
    def kind(self) -> str:
        """A registered drafter kind other than EAGLE-3's family (eagle3lab.drafters: its checks are its own), else
        within that family: eagle3 (three aux states into fc), eagle (EAGLE-1/2: final state), or unknown."""
        if self.drafter_kind != DEFAULT:  # a DFlash fc also takes three target layers: its architecture says what it is
            return self.drafter_kind
        arch = " ".join(self.architectures).lower()
        if "eagle3" in arch:
            return "eagle3"
        if self.fc_in and self.target_hidden_size and self.fc_in == 3 * self.target_hidden_size:
            return "eagle3"
        if "eagle" in arch or (self.fc_in and self.hidden_size and self.fc_in == 2 * self.hidden_size):
            return "eagle"
        return "unknown"

    def tensor(self, name: str):
        """One (small) tensor loaded in full, e.g. d2t / t2d, or None when no weight file holds it (imports torch)."""
        return self.checkpoint.tensor(name)

    def array(self, name: str):
        """`tensor` as a numpy array, read without torch from a .safetensors (what the doctor's checks use)."""
        return self.checkpoint.array(name)


def read_draft(path: str | Path) -> DraftInfo:
    try:
        checkpoint = open_checkpoint(path)
        shapes = checkpoint.shapes()
    except DraftFormatError as e:
        raise DoctorInputError(str(e)) from None
    return DraftInfo(
        path=checkpoint.folder, config=checkpoint.config, shapes=shapes, files=checkpoint.files, checkpoint=checkpoint
    )


@dataclass
class TargetInfo:
    source: str
    num_layers: int
    hidden_size: int
    vocab_size: int | None
    max_position_embeddings: int | None
    config: dict = field(default_factory=dict)  # the whole config.json (empty for a GGUF): what a draft copies from it


def read_target_config(spec: str) -> TargetInfo:
    """Target facts from a local folder's config.json, the embedded target, or a hub id already in the local cache."""
    from eagle3lab.models.target import EMBEDDED, TargetError, resolve

    path = Path(spec).expanduser()
    if path.is_file() and path.name.endswith(".json"):
        cfg_path = path
    elif path.is_dir():
        cfg_path = path / "config.json"
    elif spec in EMBEDDED:
        try:
            cfg_path = Path(resolve(spec)) / "config.json"
        except TargetError as e:
            raise DoctorInputError(str(e)) from None
    else:
        cfg_path = None
        if spec.count("/") == 1 and not spec.startswith((".", "/")):
            try:
                from huggingface_hub import try_to_load_from_cache

                cached = try_to_load_from_cache(spec, "config.json")
                cfg_path = Path(cached) if isinstance(cached, str) else None
            except (ImportError, ValueError, OSError):  # no hub client, or an id the hub would refuse
                cfg_path = None
        if cfg_path is None:
            raise DoctorInputError(
                f"target '{spec}' is not a local folder and its config.json is not in the local Hugging Face cache; "
                f"pass --target with a folder holding its config.json"
            )
    try:
        config = read_json(cfg_path)
    except DraftFormatError as e:  # the checkpoint module's JSON reader names the file; here it is the target's
        raise DoctorInputError(str(e)) from None
    # Multimodal targets (e.g. Kimi-K2.5) keep the language model's fields under text_config.
    if isinstance(config, dict) and "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    missing = [k for k in ("num_hidden_layers", "hidden_size") if not isinstance(config.get(k), int)]
    if missing:
        raise DoctorInputError(
            f"{cfg_path}: missing field(s) {', '.join(missing)} (needed for the layer and width checks)"
        )
    return TargetInfo(
        source=str(cfg_path),
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        vocab_size=config.get("vocab_size"),
        max_position_embeddings=config.get("max_position_embeddings"),
        config=config,
    )
