"""The retention plan, table-driven: keep counts, best and latest (also the same file), mtime ties, guards."""

from __future__ import annotations

import pytest

from opsconsole.checkpoints.records import CheckpointEntry, CheckpointMeta
from opsconsole.checkpoints.retention import plan_retention

NOW = 1_000_000.0
HOUR = 3600.0


def ckpt(
    name,
    age_h,
    *,
    epoch=None,
    step=None,
    latest=False,
    best=False,
    integrity="ok",
    fmt="torch",
    link=False,
    size=100,
    is_dir=False,
    series="run",
    unmanaged=None,
    unreadable=None,
    protections=(),
):
    """A listed unit; `series` None makes it unmanaged (the scanner decides that from the layout)."""
    return CheckpointEntry(
        path="/ck/" + name,
        name=name,
        format=fmt,
        size_bytes=size,
        mtime=NOW - age_h * HOUR,
        is_dir=is_dir,
        is_link=link,
        meta=CheckpointMeta(epoch=epoch, step=step),
        integrity=integrity,
        latest=latest,
        best=best,
        series=None if link else series,
        unmanaged=unmanaged,
        unreadable=unreadable,
        protections=protections,
        members=(name,),
    )


def seed_dir(n=6, latest=None, best=None):
    """checkpoint_epoch_0..n-1, one hour apart (epoch n-1 newest, 1 h old)."""
    latest = n - 1 if latest is None else latest
    return [ckpt("checkpoint_epoch_%d.pt" % i, n - i, epoch=i, latest=i == latest, best=i == best) for i in range(n)]


def deleted(plan):
    return sorted(item.name for item in plan.items if item.delete)


CASES = [
    # (id, entries, keep, expected deleted names)
    ("keep3-of-6", seed_dir(6), 3, ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"]),
    ("keep0-keeps-latest", seed_dir(4), 0, ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"]),
    ("keep-more-than-there-are", seed_dir(3), 10, []),
    (
        "keep1-best-old",
        seed_dir(5, best=1),
        1,
        ["checkpoint_epoch_0.pt", "checkpoint_epoch_2.pt", "checkpoint_epoch_3.pt"],
    ),
    (
        "best-equals-latest",
        seed_dir(5, latest=4, best=4),
        2,
        ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"],
    ),
    ("latest-points-at-an-old-one", seed_dir(5, latest=0), 2, ["checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"]),
    # Same mtime: the step, then epoch, then the natural name order decide (epoch_10 is newer than epoch_9).
    (
        "mtime-ties-by-epoch",
        [ckpt("checkpoint_epoch_%d.pt" % i, 2, epoch=i) for i in (8, 9, 10)],
        1,
        ["checkpoint_epoch_8.pt", "checkpoint_epoch_9.pt"],
    ),
    ("mtime-ties-by-name", [ckpt("run_%d.pt" % i, 2) for i in (2, 10, 9)], 2, ["run_2.pt"]),
    (
        "mtime-ties-by-step",
        [ckpt("a.pt", 2, step=300), ckpt("b.pt", 2, step=100), ckpt("c.pt", 2, step=200)],
        1,
        ["b.pt", "c.pt"],
    ),
    # A best copy takes no keep place; it is kept as best.
    (
        "best-copy",
        seed_dir(4) + [ckpt("checkpoint_best.pt", 3, epoch=1, best=True, series=None)],
        2,
        ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt"],
    ),
    # Truncated: no keep place, deleted when old; the newest good ones stay.
    (
        "truncated-takes-no-place",
        seed_dir(4)[:3] + [ckpt("checkpoint_epoch_3.pt", 0.9, epoch=3, integrity="truncated")],
        2,
        ["checkpoint_epoch_0.pt", "checkpoint_epoch_3.pt"],
    ),
    (
        "links-and-unknown-never",
        [
            ckpt("a.pt", 5),
            ckpt("b.pt", 4),
            ckpt("c.pt", 3, link=True, fmt="link"),
            ckpt("d.bin", 6, fmt="unknown", series=None),
        ],
        0,
        ["a.pt", "b.pt"],
    ),
    # Issue 13: only series members are candidates; the rest is never deleted, however old.
    (
        "final-model-and-lone-files-never",
        [
            ckpt("checkpoint-100", 9, step=100, series="checkpoint-N/", is_dir=True),
            ckpt("checkpoint-200", 8, step=200, series="checkpoint-N/", is_dir=True),
            ckpt("model.safetensors", 7, series=None, unmanaged="final model"),
            ckpt("weights.pth", 20, series=None),
            ckpt("old.pt", 30, fmt="torch-legacy", series=None),
        ],
        1,
        ["checkpoint-100"],
    ),
    # Each series keeps its own newest N.
    (
        "per-series",
        [ckpt("global_step%d" % s, 10 - s / 100, step=s, series="global_stepN/", is_dir=True) for s in (100, 200, 300)]
        + [ckpt("iter_%07d" % s, 10 - s / 100, step=s, series="iter_N/", is_dir=True) for s in (100, 200)],
        1,
        ["global_step100", "global_step200", "iter_0000100"],
    ),
    # The recorded step orders a series, not mtime (a copied older checkpoint is not the newest).
    (
        "step-beats-mtime",
        [ckpt("checkpoint-300", 5, step=300), ckpt("checkpoint-100", 1, step=100)],
        1,
        ["checkpoint-100"],
    ),
    # Could not read: kept with the reason and no keep place; only proven damage is deleted.
    (
        "unreadable-kept",
        [ckpt("checkpoint_epoch_%d.pt" % i, 5 - i, epoch=i) for i in range(3)]
        + [ckpt("checkpoint_epoch_3.pt", 1, epoch=3, unreadable="could not read: data.pkl over the limit")],
        1,
        ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt"],
    ),
    (
        "protections-keep",
        [
            ckpt(
                "epoch=%d-step=%d.ckpt" % (i, i * 10),
                5 - i,
                epoch=i,
                step=i * 10,
                protections=("top-k of ModelCheckpoint(monitor=val_acc, mode=max)",) if i in (0, 2) else (),
            )
            for i in range(4)
        ],
        1,
        ["epoch=1-step=10.ckpt"],
    ),
    (
        "nested-series-not-managed-here",
        [
            ckpt(
                "checkpoints/checkpoint_%d" % i,
                5 - i,
                series="checkpoint_N/",
                is_dir=True,
                unmanaged="inside checkpoints/",
            )
            for i in range(3)
        ],
        0,
        [],
    ),
]


@pytest.mark.parametrize("entries, keep, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan_deletes_exactly(entries, keep, expected):
    plan = plan_retention(entries, keep=keep, min_age=600, now=NOW, root="/ck")
    assert deleted(plan) == expected
    assert plan.bytes_freed == 100 * len(expected)
    assert len(plan.items) == len(entries)
    for item in plan.items:
        assert item.reasons, item  # every verdict says why


def test_reasons_name_each_protection():
    entries = seed_dir(5, latest=4, best=4) + [ckpt("fresh.pt", 0.05, epoch=5), ckpt("held.pt", 9)]
    plan = plan_retention(entries, keep=1, min_age=600, now=NOW, open_paths={"/ck/held.pt"}, root="/ck")
    reasons = {item.name: item.reasons for item in plan.items}
    assert reasons["checkpoint_epoch_4.pt"] == ("best", "latest")  # fresh.pt took the one newest place
    assert reasons["fresh.pt"][0] == "newest 1 of run (#1)" and "min_age" in reasons["fresh.pt"][1]
    assert reasons["held.pt"] == ("open by a process",)
    assert reasons["checkpoint_epoch_0.pt"] == ("older than the newest 1 of run",)
    # Newest first, as the confirmation lists them.
    assert [i.name for i in plan.items][:2] == ["fresh.pt", "checkpoint_epoch_4.pt"]


@pytest.mark.parametrize("age_s, protected", [(0, True), (599, True), (601, False), (-30, True)])
def test_min_age_edge(age_s, protected):
    entry = ckpt("x.pt", age_s / HOUR)
    plan = plan_retention([entry], keep=0, min_age=600, now=NOW)
    assert plan.items[0].delete is not protected


def test_an_open_file_inside_a_checkpoint_dir_protects_the_dir():
    entry = ckpt("checkpoint-500", 5, step=500, fmt="hf-trainer", is_dir=True)
    plan = plan_retention([entry], keep=0, min_age=0, now=NOW, open_paths={"/ck/checkpoint-500/optimizer.pt"})
    assert not plan.items[0].delete and plan.items[0].reasons == ("open by a process",)


@pytest.mark.parametrize("keep, min_age", [(-1, 0), (1, -5)])
def test_bad_arguments_raise(keep, min_age):
    with pytest.raises(ValueError):
        plan_retention([], keep=keep, min_age=min_age, now=NOW)


def test_plan_is_pure():
    entries = seed_dir(6)
    first = plan_retention(entries, keep=2, min_age=600, now=NOW)
    assert plan_retention(list(reversed(entries)), keep=2, min_age=600, now=NOW) == first


# --- the [[checkpoints]] keys that drive the plan ------------------------------------------------


def test_config_keep_and_min_age():
    from opsconsole.config import CheckpointDirConfig, ConfigError, parse_config

    cfg = parse_config(
        '[[checkpoints]]\npath = "/ck"\nkeep = 5\nmin_age = 30\n[[checkpoints]]\npath = "/other"\n', "c.toml"
    )
    assert cfg.checkpoints == (
        CheckpointDirConfig(path="/ck", keep=5, min_age=30.0),
        CheckpointDirConfig(path="/other"),
    )
    assert (cfg.checkpoints[1].keep, cfg.checkpoints[1].min_age) == (3, 600.0)
    for text, message in [
        ("keep = -1", "c.toml:3: checkpoints[0].keep: must be at least 0, got -1"),
        ("keep = 2.5", "c.toml:3: checkpoints[0].keep: expected an integer, got 2.5"),
        ("min_age = -3", "c.toml:3: checkpoints[0].min_age: must be at least 0, got -3"),
        ('min_age = "10m"', 'c.toml:3: checkpoints[0].min_age: expected a number, got "10m"'),
        ("max_to_keep = 3", "c.toml:3: checkpoints[0].max_to_keep: unknown key"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_config('[[checkpoints]]\npath = "/ck"\n%s\n' % text, "c.toml")
        assert str(err.value).startswith(message), str(err.value)
