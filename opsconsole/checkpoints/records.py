"""What the checkpoint readers produce: plain frozen records the pane, the CLI and the planner share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

# Formats, as listed and printed in --json.
FORMAT_TORCH = "torch"  # torch.save zip (.pt .pth .bin .ckpt)
FORMAT_LIGHTNING = "lightning"  # a torch zip written by Lightning (epoch=N-step=M.ckpt, last.ckpt)
FORMAT_LEGACY = "torch-legacy"  # a pre-1.6 non-zip pickle: listed, never opened
FORMAT_SAFETENSORS = "safetensors"
FORMAT_HF = "hf-trainer"  # a Hugging Face Trainer checkpoint-N/ directory
FORMAT_DCP = "dcp"  # a torch.distributed.checkpoint directory (.metadata + __R_N.distcp)
FORMAT_LINK = "link"  # a symlink whose target is not a checkpoint of this directory
FORMAT_UNKNOWN = "unknown"  # a checkpoint-like name whose content we cannot tell
FORMAT_ACCELERATE = "accelerate"  # an accelerate save_state directory (model, optimizer.bin, random_states_N.pkl)
FORMAT_DEEPSPEED = "deepspeed"  # a DeepSpeed tag directory (mp_rank_00_model_states.pt, *_optim_states.pt)
FORMAT_MEGATRON = "megatron"  # a Megatron iter_NNNNNNN/ directory (mp_rank_XX/model_optim_rng.pt)

# Layouts: which library wrote a unit, as the listing shows it (one unit = what that library calls one checkpoint).
LAYOUT_CHECKPOINT_MANAGER = "checkpoint-manager"  # checkpoint_epoch_N.pt, checkpoint_best.pt, checkpoint_latest.pt
LAYOUT_NUMBERED = "numbered-files"  # <prefix>_epoch_N.pt / _step_N.pt families written by a training loop
LAYOUT_LIGHTNING = "lightning"  # ModelCheckpoint's .ckpt files and last.ckpt
LAYOUT_HF_CHECKPOINT = "hf-trainer"  # Trainer's checkpoint-N/ directories
LAYOUT_HF_FINAL = "hf-final-model"  # save_model()/save_pretrained() files at the top of an output dir
LAYOUT_ACCELERATE = "accelerate"  # save_state directories, checkpoints/checkpoint_N/
LAYOUT_DEEPSPEED = "deepspeed"  # global_stepN/ tags and the `latest` file
LAYOUT_MEGATRON = "megatron"  # iter_NNNNNNN/ and latest_checkpointed_iteration.txt
LAYOUT_DCP = "dcp"  # a torch.distributed.checkpoint directory
LAYOUT_TORCHTITAN = "torchtitan"  # step-N/ DCP directories
LAYOUT_SHARDED = "sharded-safetensors"  # model-0000K-of-0000N.safetensors with model.safetensors.index.json
LAYOUT_FILE = "file"  # one torch.save or safetensors file outside any series
LAYOUT_LINK = "link"

# The mark of the tag DeepSpeed's `latest` file or Megatron's latest_checkpointed_iteration.txt names:
# what their loaders resume, in every listing and reason ("latest" would say newest, and a newer tag
# may stand beside it). Its protection starts with these words.
CURRENT_TAG = "current tag"

# Integrity values (the `integrity` key of --json).
INTEGRITY_OK = "ok"
INTEGRITY_TRUNCATED = "truncated"
INTEGRITY_CORRUPT = "corrupt"
INTEGRITY_UNCHECKED = "unchecked"
INTEGRITY_NO_CRC = "no_crc"
INTEGRITIES = (INTEGRITY_OK, INTEGRITY_TRUNCATED, INTEGRITY_CORRUPT, INTEGRITY_UNCHECKED, INTEGRITY_NO_CRC)
BROKEN = (INTEGRITY_TRUNCATED, INTEGRITY_CORRUPT)


@dataclass(frozen=True)
class StateDictSummary:
    """The model weights inside a checkpoint: tensor count, dtypes and bytes, without loading them."""

    keys: int = 0
    dtypes: Tuple[Tuple[str, int], ...] = ()  # (dtype, tensors of it), most common first
    bytes: int = 0
    source: str = ""  # the top-level key it was found under ("" for a bare state dict)


@dataclass(frozen=True)
class ModelCheckpointState:
    """One Lightning ModelCheckpoint callback's state, as the .ckpt records it (never guessed from names)."""

    key: str  # the callbacks key: ModelCheckpoint{'monitor': 'val_acc', 'mode': 'max', ...}
    monitor: Optional[str] = None
    mode: Optional[str] = None  # min / max, from the key (the state itself does not hold it)
    best_model_path: Optional[str] = None
    best_model_score: Optional[float] = None
    kth_best_model_path: Optional[str] = None
    last_model_path: Optional[str] = None
    dirpath: Optional[str] = None
    best_k_models: Tuple[Tuple[str, Optional[float]], ...] = ()  # (path, score)


@dataclass(frozen=True)
class CheckpointMeta:
    """What was read from one checkpoint's metadata (never its tensors)."""

    epoch: Optional[int] = None
    step: Optional[int] = None
    loss: Optional[float] = None
    best_loss: Optional[float] = None
    timestamp: Optional[str] = None
    metrics: Tuple[Tuple[str, Any], ...] = ()
    top_keys: Tuple[str, ...] = ()
    details: Tuple[Tuple[str, str], ...] = ()  # (top-level key, one-line description) for the detail view
    state_dict: Optional[StateDictSummary] = None
    has_optimizer: Optional[bool] = None
    has_scheduler: Optional[bool] = None
    tensor_count: Optional[int] = None  # from the zip directory's data/N entries (or safetensors header)
    tensor_bytes: Optional[int] = None
    unsafe_globals: Tuple[str, ...] = ()  # globals outside the safe list, reported and never run
    best_checkpoint: Optional[str] = None  # HF trainer_state.json's best_model_checkpoint
    epoch_float: Optional[float] = None  # HF's fractional epoch (1.5 = half way through the second)
    callbacks: Tuple[ModelCheckpointState, ...] = ()  # Lightning's ModelCheckpoint states
    crc_recorded: Optional[bool] = None  # False: the zip holds CRC 0 everywhere


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint of a directory (a file, or a HF/DCP directory), as the pane and --json show it."""

    path: str
    name: str
    format: str
    size_bytes: int
    mtime: float
    is_dir: bool = False
    is_link: bool = False
    link_target: Optional[str] = None
    meta: CheckpointMeta = field(default_factory=CheckpointMeta)
    integrity: str = INTEGRITY_UNCHECKED
    problem: Optional[str] = None
    latest: bool = False  # the target of the directory's latest symlink (or last.ckpt, DeepSpeed `latest`)
    best: bool = False  # checkpoint_best.pt, HF best_model_checkpoint, else the lowest loss
    lowest_loss: bool = False  # the lowest loss of the directory (marked in the loss column)
    crc_checked: bool = False  # integrity comes from a full CRC check, not only the quick one
    layout: str = LAYOUT_FILE  # which library's layout this unit belongs to
    unit: str = ""  # what the unit is, in words: "checkpoint", "final model", "incomplete save" ...
    series: Optional[str] = None  # the recognised series it is a member of (a retention candidate); None: not managed
    unmanaged: Optional[str] = None  # why it is no retention candidate (final model, no epoch or step, legacy ...)
    members: Tuple[
        str, ...
    ] = ()  # the unit's top-level paths relative to the listed root (a directory with all it holds); whole or not at all
    protections: Tuple[str, ...] = ()  # what the library recorded that keeps it: best, top-k, current tag ...
    unreadable: Optional[str] = None  # its metadata could not be read (not damage): kept, never judged
    # The files this entry's verdict was made from, as the listing stat'ed them: (path relative to
    # the listed root, st_dev, st_ino, size, mtime_ns); device and inode -1 where the file system
    # gives none (SFTP v3, whose mtime is whole seconds). Cleanup deletes a unit only while its
    # files are still these (cleanup.py); () for a unit whose files were not all judged.
    judged: Tuple[Tuple[Any, ...], ...] = ()

    @property
    def key(self) -> str:
        return self.path

    @property
    def current_tag(self) -> bool:
        """Whether DeepSpeed's `latest` or Megatron's latest_checkpointed_iteration.txt names it (CURRENT_TAG)."""
        return any(p.startswith(CURRENT_TAG) for p in self.protections)

    @property
    def epoch(self) -> Optional[int]:
        return self.meta.epoch

    @property
    def step(self) -> Optional[int]:
        return self.meta.step

    @property
    def loss(self) -> Optional[float]:
        return self.meta.loss

    def to_json(self) -> Dict[str, Any]:
        """The --json shape of one checkpoint (the keys the issue names, nothing else)."""
        loss = self.meta.loss
        if loss is not None and (loss != loss or loss in (float("inf"), float("-inf"))):
            loss = None  # JSON has no NaN/inf
        return {
            "path": self.path,
            "format": self.format,
            "size_bytes": self.size_bytes,
            "mtime": self.mtime,
            "epoch": self.meta.epoch,
            "step": self.meta.step,
            "loss": loss,
            "best": self.best,
            # `latest`: the unit a resume loads (the latest link's target, last.ckpt, HF's highest
            # checkpoint-N, the tag a tracker file names); `current_tag` says it is that last kind, which
            # the text calls "current tag" (DeepSpeed's `latest` file or Megatron's tracker names it): a newer
            # tag may stand beside it, so it is not the newest. Readers depend on `latest`; it stays.
            "latest": self.latest,
            "current_tag": self.current_tag,
            "integrity": self.integrity,
            "problem": self.problem,
            "layout": self.layout,
            "unit": self.unit,
            "series": self.series,
            "managed": self.series is not None,
            "unmanaged": self.unmanaged,
            "protections": list(self.protections),
            "unreadable": self.unreadable,
            "members": list(self.members),
        }


@dataclass(frozen=True)
class DirListing:
    """One configured directory: its checkpoints, totals and the free space of its file system."""

    root: str
    node: str = "local"
    entries: Tuple[CheckpointEntry, ...] = ()
    total_bytes: int = 0
    free_bytes: Optional[int] = None
    fs_bytes: Optional[int] = None
    problem: Optional[str] = None  # the directory itself could not be listed
    scanned_at: float = 0.0
    scan_seconds: float = 0.0
    other_files: int = 0  # names that are not checkpoints (logs, configs): never touched
    # What the listing must say of the directory as a whole (two HF runs saved into one output_dir:
    # which checkpoint resume_from_checkpoint=True resumes; hf_runs.resume_warnings).
    warnings: Tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return "%s:%s" % (self.node, self.root)

    # The totals as the listing shows its units: the members of a recognised series (what cleanup
    # manages) apart from the rest it lists (a final model, last.ckpt, lone or unrelated .pt/.bin
    # files, links): total_bytes is both, and counting the rest as checkpoints overstated them.
    @property
    def managed_count(self) -> int:
        return sum(1 for e in self.entries if e.series is not None)

    @property
    def managed_bytes(self) -> int:
        return sum(e.size_bytes for e in self.entries if e.series is not None and not e.is_link)

    @property
    def unmanaged_count(self) -> int:
        return len(self.entries) - self.managed_count

    @property
    def unmanaged_bytes(self) -> int:
        return sum(e.size_bytes for e in self.entries if e.series is None and not e.is_link)
